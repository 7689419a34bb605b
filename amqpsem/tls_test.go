package amqpsem_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/internal/testcerts"
)

// amqpsURL returns the broker's URL as amqps:// to addr, with the password
// replaced when password is not empty.
func amqpsURL(t *testing.T, addr, password string) string {
	t.Helper()
	u, err := url.Parse(broker.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme, u.Host = "amqps", addr
	if password != "" {
		u.User = url.UserPassword(u.User.Username(), password)
	}
	return u.String()
}

// TestTLS runs a semaphore over amqps://: a TLS-terminating proxy with a
// certificate of a test CA stands in front of the plaintext broker; the
// second proxy also requires a client certificate of that CA.
func TestTLS(t *testing.T) {
	certs := testcerts.New(t)
	tests := []struct {
		name          string
		requireClient bool
		urlParams     bool // the amqp091 URL parameters instead of WithTLS
	}{
		{"server certificate", false, false},
		{"mutual TLS", true, false},
		{"URL parameters", true, true},
	}
	base := name(t)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			proxy := testcerts.StartProxy(t, certs.ServerConfig(tc.requireClient), broker.Addr)
			cfg := certs.ClientConfig(tc.requireClient)
			raw, opts := amqpsURL(t, proxy.Addr, ""), []amqpsem.DialOption{amqpsem.WithTLS(cfg)}
			if tc.urlParams {
				raw += "?" + url.Values{"cacertfile": {certs.CAFile}, "certfile": {certs.ClientCertFile},
					"keyfile": {certs.ClientKeyFile}, "server_name_indication": {"localhost"}}.Encode()
				opts = nil
			}
			c, err := amqpsem.Dial(semtest.Context(t, 20*time.Second), raw, opts...)
			if err != nil {
				t.Fatalf("dial amqps via the proxy: %v", err)
			}
			t.Cleanup(func() { _ = c.Close() })
			if cfg.ServerName != "" {
				t.Errorf("Dial changed the caller's tls.Config: ServerName %q", cfg.ServerName)
			}

			s, err := amqpsem.Init(semtest.Context(t, 20*time.Second), c, base+strconv.Itoa(i), 1)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			p, err := s.Acquire(semtest.Context(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.TryAcquire(semtest.Context(t, 10*time.Second)); !errors.Is(err, tokensem.ErrNoPermit) {
				t.Fatalf("TryAcquire while the only permit is held: %v, want ErrNoPermit", err)
			}
			if err := p.Release(semtest.Context(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			p, err = s.TryAcquire(semtest.Context(t, 10*time.Second))
			if err != nil {
				t.Fatalf("TryAcquire after the release: %v", err)
			}
			if err := p.Release(semtest.Context(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			if errs := proxy.HandshakeErrors(); len(errs) > 0 {
				t.Errorf("failed handshakes at the proxy: %v", errs)
			}
		})
	}
}

// TestTLSFailures: every TLS misconfiguration is a prompt error wrapping
// ErrTLS (not ErrUnreachable, not ErrAuth), and a wrong password over TLS
// is still ErrAuth.
func TestTLSFailures(t *testing.T) {
	certs := testcerts.New(t)
	other := testcerts.New(t) // a CA the proxy's certificate does not chain to
	proxy := testcerts.StartProxy(t, certs.ServerConfig(false), broker.Addr)
	mtls := testcerts.StartProxy(t, certs.ServerConfig(true), broker.Addr)
	hangUp := startHangUp(t, certs.ServerConfig(false))
	params := func(addr string, kv ...string) string {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return amqpsURL(t, addr, "") + "?" + v.Encode()
	}

	wrongHost := certs.ClientConfig(false)
	wrongHost.ServerName = "broker.example"
	tests := []struct {
		name    string
		url     string
		opts    []amqpsem.DialOption
		wantErr error
		wantMsg string
	}{
		{"system roots (no WithTLS)", amqpsURL(t, proxy.Addr, ""), nil, amqpsem.ErrTLS, "unknown authority"},
		{"another CA", amqpsURL(t, proxy.Addr, ""), []amqpsem.DialOption{amqpsem.WithTLS(other.ClientConfig(false))}, amqpsem.ErrTLS, "unknown authority"},
		{"certificate for another host", amqpsURL(t, proxy.Addr, ""), []amqpsem.DialOption{amqpsem.WithTLS(wrongHost)}, amqpsem.ErrTLS, "broker.example"},
		{"plaintext port", amqpsURL(t, broker.Addr, ""), []amqpsem.DialOption{amqpsem.WithTLS(certs.ClientConfig(false))}, amqpsem.ErrTLS, "tls"},
		{"no client certificate", amqpsURL(t, mtls.Addr, ""), []amqpsem.DialOption{amqpsem.WithTLS(certs.ClientConfig(false))}, amqpsem.ErrTLS, "certificate"},
		{"client certificate of another CA", amqpsURL(t, mtls.Addr, ""), []amqpsem.DialOption{amqpsem.WithTLS(&tls.Config{RootCAs: certs.CAPool, Certificates: []tls.Certificate{other.Client}})}, amqpsem.ErrTLS, "certificate"},
		{"closed after the handshake", amqpsURL(t, hangUp, ""), []amqpsem.DialOption{amqpsem.WithTLS(certs.ClientConfig(false))}, amqpsem.ErrTLS, "right after the TLS handshake"},
		{"URL parameters, another CA", params(proxy.Addr, "cacertfile", other.CAFile), nil, amqpsem.ErrTLS, "unknown authority"},
		{"URL parameters, wrong server name", params(proxy.Addr, "cacertfile", certs.CAFile, "server_name_indication", "broker.example"), nil, amqpsem.ErrTLS, "broker.example"},
		{"URL parameters, no client certificate", params(mtls.Addr, "cacertfile", certs.CAFile), nil, amqpsem.ErrTLS, "certificate required"},
		{"URL parameters, missing CA file", params(proxy.Addr, "cacertfile", certs.CAFile+".absent"), nil, tokensem.ErrInvalidOption, "cacertfile"},
		{"malformed URL", "amqps://guest:wrong-password@127.0.0.1:port/", nil, tokensem.ErrInvalidOption, "invalid port"},
		{"wrong password", amqpsURL(t, proxy.Addr, "wrong-password"), []amqpsem.DialOption{amqpsem.WithTLS(certs.ClientConfig(false))}, amqpsem.ErrAuth, "credentials refused"},
		{"client certificate, wrong password", amqpsURL(t, mtls.Addr, "wrong-password"), []amqpsem.DialOption{amqpsem.WithTLS(certs.ClientConfig(true))}, amqpsem.ErrAuth, "credentials refused"},
		{"nil config", amqpsURL(t, proxy.Addr, ""), []amqpsem.DialOption{amqpsem.WithTLS(nil)}, tokensem.ErrInvalidOption, "nil TLS config"},
		{"WithTLS on amqp://", broker.URL, []amqpsem.DialOption{amqpsem.WithTLS(certs.ClientConfig(false))}, tokensem.ErrInvalidOption, "amqps://"},
	}
	// In parallel: RabbitMQ answers refused credentials only after a delay.
	errs := make([]error, len(tests))
	took := make([]time.Duration, len(tests))
	var wg sync.WaitGroup
	for i, tc := range tests {
		wg.Go(func() {
			start := time.Now()
			c, err := amqpsem.Dial(semtest.Context(t, 30*time.Second), tc.url, tc.opts...)
			took[i], errs[i] = time.Since(start), err
			if err == nil {
				_ = c.Close()
			}
		})
	}
	wg.Wait()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := errs[i]
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Dial = %v, want an error wrapping %v", err, tc.wantErr)
			}
			for _, not := range []error{amqpsem.ErrTLS, amqpsem.ErrUnreachable, amqpsem.ErrAuth} {
				if not != tc.wantErr && errors.Is(err, not) {
					t.Errorf("Dial = %v, also wraps %v", err, not)
				}
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Dial = %q, want it to mention %q", err, tc.wantMsg)
			}
			if strings.Contains(err.Error(), "wrong-password") || strings.Contains(err.Error(), ":guest@") {
				t.Errorf("the error shows the password: %q", err)
			}
			if took[i] > 15*time.Second {
				t.Errorf("Dial took %v", took[i])
			}
		})
	}
}

// startHangUp runs a TLS server on loopback that completes the handshake and
// then closes the connection at once, as some brokers and proxies refuse a
// client certificate.
func startHangUp(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// TestTLSHandshakeBounded: a peer that accepts TCP and never answers the
// TLS handshake ends Dial at the context's deadline, or when it is
// cancelled, with ErrUnreachable.
func TestTLSHandshakeBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // silent: never read, never written
		}
	})

	certs := testcerts.New(t)
	tests := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"deadline", func() (context.Context, context.CancelFunc) { return context.WithTimeout(t.Context(), time.Second) }},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(time.Second, cancel)
			return ctx, cancel
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			c, err := amqpsem.Dial(ctx, amqpsURL(t, ln.Addr().String(), ""), amqpsem.WithTLS(certs.ClientConfig(false)))
			took := time.Since(start)
			if err == nil {
				_ = c.Close()
				t.Fatal("Dial to a silent peer succeeded")
			}
			if !errors.Is(err, amqpsem.ErrUnreachable) || errors.Is(err, amqpsem.ErrTLS) {
				t.Errorf("Dial = %v, want ErrUnreachable (not a TLS failure)", err)
			}
			if took > 5*time.Second {
				t.Errorf("Dial took %v; the context ended after 1s", took)
			}
		})
	}
}
