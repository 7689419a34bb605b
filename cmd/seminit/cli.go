package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/redact"
)

// DefaultURL is used when neither --url nor TOKENSEM_URL is set.
const DefaultURL = "nats://127.0.0.1:4222"

const usage = `seminit - distributed semaphores whose permits are broker messages

Usage:
  seminit server   [--listen 127.0.0.1:4222] [--store DIR] [--user U --password P]
                   [--tls-cert FILE --tls-key FILE [--tls-ca FILE]] [--metrics-listen ADDR]
                   [--sync always|interval [--sync-interval DUR]]
                   [--server-name NAME --cluster-listen HOST:PORT --routes URL,...
                    [--cluster-name NAME]] [--insecure-no-auth]
  seminit init     --name NAME --permits N [--lease DUR] [--replicas R]
  seminit status   --name NAME [--count | --watch INTERVAL]
  seminit exec     --name NAME [--name NAME...] [--weight K] [--priority P] [--wait DUR]
                   [--max-hold DUR] [--init-permits N] [--kill-after DUR] [--conflict-exit-code N]
                   [--pass-credentials]
                   -- CMD [ARGS...]
  seminit reconcile --name NAME [--repair] [--watch INTERVAL [--metrics-listen ADDR]]
  seminit resize   --name NAME --permits M [--step K] [--interval DUR]
  seminit adapt    --name NAME --range MIN..MAX [--leader NAME] [--lease DUR]
                   [--window DUR] [--algorithm gradient|aimd] [--max-step K]
                   [--metrics-listen ADDR]
  seminit list
  seminit delete   --name NAME [--force]
  seminit completion bash|zsh|fish
  seminit help VERB

Flags common to every verb but server:
  --url URL        broker URL; the scheme picks the backend: nats:// (NATS
                   JetStream), amqp:// or amqps:// (RabbitMQ). A comma-separated
                   list names the nodes of one cluster: seminit connects to the
                   first that answers and fails over to the others. Default
                   $TOKENSEM_URL, else ` + DefaultURL + `
  --json           machine-readable output
  --timeout DUR    bound on each broker round trip (default 10s)
  --log-level L    the libraries' log on stderr from L: debug, info, warn
                   (default) or error
  --key-file PATH  shared token signing key (else $TOKENSEM_KEY, else unsigned)
  --group G        nats:// only: the semaphore named is a key of group G, whose
                   keys share one stream and one KV bucket (natssem.WithGroup);
                   list then lists the keys of G. Default $TOKENSEM_GROUP
  --inbox-prefix P nats:// only: the prefix of this client's reply subjects
                   (nats.CustomInboxPrefix; default _INBOX). Give each user a
                   prefix of its own and let it subscribe to P.> alone, so that
                   no user reads another's replies (docs/permissions-nats.md).
                   Default $TOKENSEM_INBOX_PREFIX

Credentials and TLS (common to the same verbs; credentials in the URL,
nats://user:pass@host or amqp://user:pass@host, work too; these flags win):
  --user NAME      user name
  --password PASS  password (else $TOKENSEM_PASSWORD, which keeps it off the
                   command line)
  --token TOKEN    NATS token (else $TOKENSEM_TOKEN); nats:// only
  --creds FILE     NATS credentials file (user JWT and seed); nats:// only
  --tls-ca FILE    PEM CA certificates to verify the broker with (default:
                   the system's roots); implies TLS
  --tls-cert FILE  PEM client certificate, with --tls-key FILE
  --tls-insecure   do not verify the broker's certificate (warns; tests only)
  TLS on RabbitMQ needs an amqps:// URL. A certificate the client or the
  broker rejects exits 69 with the reason; refused credentials exit 77.

seminit server: --user/--password (or $TOKENSEM_PASSWORD) require those
credentials; --tls-cert/--tls-key serve TLS only (its URL is tls://), and
--tls-ca FILE also requires client certificates signed by FILE's CAs.
A --listen address off loopback without --user or --tls-ca, and any
--cluster-listen off loopback (cluster routes are not authenticated), is
refused (exit 64): whoever reaches the port could take and delete every
semaphore. --insecure-no-auth allows them, with a warning, where the network
is the guard (a pod binding 0.0.0.0 behind a network policy).
--sync always (the default with --store) fsyncs every JetStream write
before acknowledging it; --sync interval (the default for a temporary store)
fsyncs every --sync-interval (default 2m, nats-server's default). Interval
saves about 1 ms per write on one node, 2 ms on a cluster (measured on a VM
disk), but a power loss or OS crash can then lose acknowledged writes:
tokens duplicated or lost, a fencing number handed out twice.
--cluster-listen makes the server one node of a cluster: give every node a
distinct --server-name and its own --store, and the same --routes (the
cluster addresses of all nodes, nats-route://host:port; a node ignores its
own) and --cluster-name (default tokensem). A node prints its "listening"
line at once and "JetStream ready" when a majority of the nodes has elected
a meta leader; until then JetStream requests fail or time out. For a moment
after that, init --replicas 3 can still fail with "no suitable peers for
placement" (the leader has not heard from every node yet): run it again.

Exit codes: 0 ok, 1 reconcile or resize: unhealthy after the run (or a failure
not listed here; its message says what), 64 usage or bad input, 69 broker
unreachable or failing a request, 70 exec: permit lost (child stopped), 75 no
permit within --wait (a waiter rides through a cluster's failover until then),
or too many callers waiting already, or delete: a permit is held (nothing
changed; --force deletes anyway and every holder's exec exits 70), 77 credentials
refused, or an operation the broker's permissions refuse (the message names
the subject, queue or exchange; never retried), 78 not initialized, permit-count/lease/key mismatch, or a stored
configuration that is invalid (delete --force removes it), 124 exec: --max-hold
ran out (child stopped), 128+N exec: interrupted by signal N; otherwise exec
exits with the command's status; --weight above the semaphore's permits exits
64. The command's environment carries TOKENSEM_NAME, TOKENSEM_SLOT (the token
index) and TOKENSEM_FENCE (the fencing number, to hand to the protected
resource) of its first permit, and TOKENSEM_NAMES, TOKENSEM_SLOTS and
TOKENSEM_FENCES of all of them (--weight K: K entries; --name given more than
once: one per semaphore, in the order given), comma-separated, in one order.
It carries no credentials: $TOKENSEM_URL without its password or token, and
none of $TOKENSEM_PASSWORD, $TOKENSEM_TOKEN and $TOKENSEM_KEY, unless
--pass-credentials hands them on as seminit got them (for a command that runs
seminit itself).
`

// globals are the flags every broker verb shares.
type globals struct {
	url     string
	json    bool
	timeout time.Duration
	// timeoutSet says --timeout was given: only then is it imposed on the
	// semaphore's round trips (natssem bounds an unset one by the lease).
	timeoutSet bool
	keyFile    string
	verbose    bool   // --verbose: report long work even when stderr is no terminal
	group      string // --group: NATS semaphores are keys of this group
	inbox      string // --inbox-prefix: NATS reply subjects' prefix

	// Credentials; empty means not given. See password and token for the
	// environment fallbacks.
	user, passwordFlag, tokenFlag, creds string
	// TLS; see tlsConfig.
	tlsCA, tlsCert, tlsKey string
	tlsInsecure            bool

	warn io.Writer // warnings (--tls-insecure): the process's stderr

	logLevel slog.Level // --log-level: the libraries' log on stderr
}

// logger is the libraries' log: text on stderr, from --log-level up, with
// every credential hidden (redact.Text) in its message and attributes.
func (g *globals) logger() *slog.Logger {
	secrets := g.secrets()
	return slog.New(slog.NewTextHandler(g.warn, &slog.HandlerOptions{
		Level: g.logLevel,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Value.Kind() {
			case slog.KindString:
				a.Value = slog.StringValue(redact.Text(a.Value.String(), secrets...))
			case slog.KindAny:
				a.Value = slog.StringValue(redact.Text(fmt.Sprint(a.Value.Any()), secrets...))
			}
			return a
		},
	}))
}

// secrets are the credentials g was given, in flags, the environment and
// the URL, for redact.Text.
func (g *globals) secrets() []string {
	pass, _ := g.password()
	tok, _ := g.token()
	return append(redact.Secrets(g.url), pass, tok, os.Getenv("TOKENSEM_KEY"))
}

// runSecrets are the credentials a run of seminit was given in its
// arguments (--password, --token, --url) and its environment
// ($TOKENSEM_PASSWORD, $TOKENSEM_TOKEN, $TOKENSEM_KEY, $TOKENSEM_URL):
// what run hides in every message, whatever quotes them. It reads the
// arguments itself, so that it holds even for a run whose flags fail to
// parse.
func runSecrets(args, environ []string) []string {
	var out []string
	take := func(name, v string) {
		switch name {
		case "--url", "TOKENSEM_URL":
			out = append(out, redact.Secrets(v)...)
		case "--password", "--token", "TOKENSEM_PASSWORD", "TOKENSEM_TOKEN", "TOKENSEM_KEY":
			out = append(out, v)
		}
	}
	for _, kv := range environ {
		name, v, _ := strings.Cut(kv, "=")
		take(name, v)
	}
	for i, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !hasValue && i+1 < len(args) {
			v = args[i+1]
		}
		take("--"+name, v)
	}
	return out
}

func (g *globals) register(fs *flag.FlagSet) {
	def := os.Getenv("TOKENSEM_URL")
	if def == "" {
		def = DefaultURL
	}
	fs.StringVar(&g.url, "url", def, "broker URL")
	fs.BoolVar(&g.json, "json", false, "JSON output")
	g.timeout = defaultTimeout
	fs.Func("timeout", "bound on each broker round trip (default: 10s to connect; a semaphore's requests min(5s, lease/4))", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		if d <= 0 {
			return fmt.Errorf("--timeout %s must be positive", v)
		}
		g.timeout, g.timeoutSet = d, true
		return nil
	})
	fs.StringVar(&g.keyFile, "key-file", "", "token signing key file")
	fs.BoolVar(&g.verbose, "verbose", false, "report the progress of long work on stderr (default: only when stderr is a terminal)")
	fs.StringVar(&g.group, "group", os.Getenv("TOKENSEM_GROUP"), "NATS: the semaphore is a key of this group (one stream and bucket for many)")
	fs.StringVar(&g.inbox, "inbox-prefix", os.Getenv("TOKENSEM_INBOX_PREFIX"), "NATS: prefix of this client's reply subjects (default _INBOX)")
	fs.StringVar(&g.user, "user", "", "user name")
	fs.StringVar(&g.passwordFlag, "password", "", "password (else $TOKENSEM_PASSWORD)")
	fs.StringVar(&g.tokenFlag, "token", "", "NATS token (else $TOKENSEM_TOKEN)")
	fs.StringVar(&g.creds, "creds", "", "NATS credentials file")
	fs.StringVar(&g.tlsCA, "tls-ca", "", "PEM CA certificates to verify the broker with")
	fs.StringVar(&g.tlsCert, "tls-cert", "", "PEM client certificate")
	fs.StringVar(&g.tlsKey, "tls-key", "", "PEM key of the client certificate")
	fs.BoolVar(&g.tlsInsecure, "tls-insecure", false, "do not verify the broker's certificate")
	g.logLevel = slog.LevelWarn
	fs.Func("log-level", "the libraries' log on stderr from this level: debug, info, warn or error (default warn)", func(v string) error {
		if err := g.logLevel.UnmarshalText([]byte(v)); err != nil {
			return fmt.Errorf("want debug, info, warn or error, not %q", v)
		}
		return nil
	})
	g.warn = os.Stderr
}

// password returns --password, else $TOKENSEM_PASSWORD, and where it came
// from ("" when neither is set).
func (g *globals) password() (pass, source string) {
	if g.passwordFlag != "" {
		return g.passwordFlag, "--password"
	}
	if p := os.Getenv("TOKENSEM_PASSWORD"); p != "" {
		return p, "$TOKENSEM_PASSWORD"
	}
	return "", ""
}

// token returns --token, else $TOKENSEM_TOKEN, and where it came from.
func (g *globals) token() (tok, source string) {
	if g.tokenFlag != "" {
		return g.tokenFlag, "--token"
	}
	if t := os.Getenv("TOKENSEM_TOKEN"); t != "" {
		return t, "$TOKENSEM_TOKEN"
	}
	return "", ""
}

// tlsConfig returns the client TLS configuration the --tls-* flags ask
// for, or nil when none is given. Unreadable or malformed files are usage
// errors.
func (g *globals) tlsConfig() (*tls.Config, error) {
	if g.tlsCA == "" && g.tlsCert == "" && g.tlsKey == "" && !g.tlsInsecure {
		return nil, nil
	}
	cfg, err := loadTLS(g.tlsCA, g.tlsCert, g.tlsKey)
	if err != nil {
		return nil, err
	}
	if g.tlsInsecure {
		cfg.InsecureSkipVerify = true
		fmt.Fprintln(g.warn, "seminit: warning: --tls-insecure: the broker's certificate is not verified; anyone on the path can impersonate it")
	}
	return cfg, nil
}

// loadTLS builds a TLS configuration from PEM files: caFile (CAs to verify
// the peer with; "" for the system's roots) and a certificate and key
// (both or neither).
func loadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, usageErr{fmt.Errorf("--tls-ca: %w", err)}
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usageErr{fmt.Errorf("--tls-ca %s: no PEM certificate in it", caFile)}
		}
	}
	switch {
	case certFile != "" && keyFile != "":
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, usageErr{fmt.Errorf("--tls-cert/--tls-key: %w", err)}
		}
		cfg.Certificates = []tls.Certificate{pair}
	case certFile != "":
		return nil, usageErr{errors.New("--tls-cert needs --tls-key")}
	case keyFile != "":
		return nil, usageErr{errors.New("--tls-key needs --tls-cert")}
	}
	return cfg, nil
}

// defaultTimeout is --timeout's default.
const defaultTimeout = 10 * time.Second

// requestTimeout is the bound on a semaphore's round trips that --timeout
// asks for; 0 (the backend's default) when it was not given.
func (g *globals) requestTimeout() time.Duration {
	if g.timeoutSet {
		return g.timeout
	}
	return 0
}

// opTimeout bounds a whole non-waiting operation (init, status, open): a
// broker that stops answering ends in an error, not a hang.
func (g *globals) opTimeout() time.Duration { return 6 * g.timeout }

// key returns the signing key from --key-file or $TOKENSEM_KEY, if any.
func (g *globals) key() ([]byte, error) {
	if g.keyFile != "" {
		b, err := os.ReadFile(g.keyFile)
		if err != nil {
			return nil, usageErr{fmt.Errorf("key file: %w", err)}
		}
		return []byte(strings.TrimRight(string(b), "\r\n")), nil
	}
	if k := os.Getenv("TOKENSEM_KEY"); k != "" {
		return []byte(k), nil
	}
	return nil, nil
}

// env carries a command's streams.
type env struct {
	stdout, stderr io.Writer
	secrets        []string      // hidden in messages: runSecrets
	signals        *signalRouter // nil when run by a test in-process
}

// warnf prints a message on stderr with every credential hidden.
func (e env) warnf(format string, args ...any) {
	fmt.Fprint(e.stderr, redact.Text(fmt.Sprintf(format, args...), e.secrets...))
}

// oneLine writes an error on one line: the lines of a joined error
// (errors.Join) are separated by "; ", and a line said before (alone or
// within another) is not said again.
func oneLine(err error) string {
	var kept []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" && !slices.ContainsFunc(kept, func(k string) bool { return strings.Contains(k, l) }) {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, "; ")
}

func (e env) printJSON(v any) {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

type command struct {
	summary string
	run     func(ctx context.Context, e env, args []string) error
}

var commands = map[string]command{
	"server":    {"run an embedded NATS JetStream server", runServer},
	"init":      {"create a semaphore (idempotent)", runInit},
	"status":    {"show a semaphore's census", runStatus},
	"exec":      {"run a command while holding a permit", runExec},
	"reconcile": {"recount tokens and repair duplicates, losses and junk", runReconcile},
	"resize":    {"change the number of permits live", runResize},
	"adapt":     {"move the number of permits after the holders' reports (a controller)", runAdapt},
	"list":      {"list the broker's semaphores", runList},
	"delete":    {"delete a semaphore (refused while a permit is held)", runDelete},
}

func run(ctx context.Context, sigs *signalRouter, args []string, stdout, stderr io.Writer) int {
	if len(args) == 2 && args[0] == "help" && args[1] != "completion" {
		// seminit help VERB is seminit VERB --help (an unknown VERB is
		// reported as one).
		args = []string{args[1], "--help"}
	}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		fmt.Fprintln(stdout, "seminit", version())
		return exitOK
	}
	if args[0] == "completion" {
		if err := runCompletion(env{stdout: stdout, stderr: stderr}, args[1:]); err != nil {
			fmt.Fprintf(stderr, "seminit completion: %v\n", err)
			return exitUsage
		}
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		hint := ""
		if s := suggest(args[0]); s != "" {
			hint = fmt.Sprintf(" (did you mean %q?)", s)
		}
		fmt.Fprintf(stderr, "seminit: unknown command %q%s; seminit --help lists the commands\n", args[0], hint)
		return exitUsage
	}
	e := env{stdout: stdout, stderr: stderr, secrets: runSecrets(args[1:], os.Environ()), signals: sigs}
	ctx, refused := withRefusals(ctx)
	err := refused.explain(cmd.run(ctx, e, args[1:]))
	if err == nil {
		return exitOK
	}
	var he helpErr
	if errors.As(err, &he) {
		verbHelp(stdout, args[0], he.fs)
		return exitOK
	}
	code := exitCode(err)
	var ec exitCodeErr
	if !errors.As(err, &ec) || ec.err != nil {
		e.warnf("seminit %s: %s\n", args[0], oneLine(err))
		if fix := fixFor(args[0], args[1:], err); fix != "" {
			e.warnf("  %s\n", fix)
		}
	}
	return code
}

// parse parses a verb's flags; it rejects positional arguments unless
// allowArgs.
func parse(fs *flag.FlagSet, args []string, allowArgs bool) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return helpErr{fs}
		}
		msg := twoDashes(err.Error())
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			if s := suggestFlag(fs, strings.TrimLeft(name, "-")); s != "" {
				msg += fmt.Sprintf(" (did you mean --%s?)", s)
			}
		}
		return usageErr{errors.New(msg)}
	}
	if !allowArgs && fs.NArg() > 0 {
		return usageErr{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// twoDashes writes the flag names in the flag package's messages ("flag
// provided but not defined: -x", "invalid value ... for flag -x") with two
// dashes, as the help and docs/cli.md do.
func twoDashes(msg string) string {
	for _, p := range []string{"defined: -", "for flag -", "argument: -", " for -"} {
		msg = strings.Replace(msg, p, p+"-", 1)
	}
	return msg
}

// isSet reports whether the flag called name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// requirePermits checks --permits: given, and a valid count.
func requirePermits(fs *flag.FlagSet, permits int) error {
	if !isSet(fs, "permits") {
		return usageErr{errors.New("--permits is required")}
	}
	return tokensem.ValidatePermits(permits)
}

func requireName(name string) error {
	if name == "" {
		return usageErr{errors.New("--name is required")}
	}
	return tokensem.ValidateName(name)
}
