package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"testing"
	"testing/iotest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// TestSkewDialer: through a skewDialer, a consumer's info reads the
// server's time an hour ahead, and natssem, reading the server's clock
// from it, sees a slot held a moment ago as long expired; through a plain
// connection both read the time as it is.
func TestSkewDialer(t *testing.T) {
	const ahead = time.Hour
	srv, err := embedded.Start(embedded.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	connect := func(opts ...nats.Option) *nats.Conn {
		nc, err := nats.Connect(srv.URL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	plain := connect()
	skewed := connect(nats.SetCustomDialer(&skewDialer{ahead: ahead, Dialer: net.Dialer{Timeout: nats.DefaultTimeout}}))
	ctx := semtest.Context(t, time.Minute)

	js, err := jetstream.New(plain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SKEW", Subjects: []string{"skew"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "SKEW", jetstream.ConsumerConfig{Durable: "c"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		nc    *nats.Conn
		ahead time.Duration
	}{{"plain", plain, 0}, {"skewed", skewed, ahead}} {
		js, err := jetstream.New(tc.nc)
		if err != nil {
			t.Fatal(err)
		}
		c, err := js.Consumer(ctx, "SKEW", "c")
		if err != nil {
			t.Fatal(err)
		}
		want := time.Now().Add(tc.ahead)
		if got := c.CachedInfo().TimeStamp; got.Sub(want).Abs() > 5*time.Second {
			t.Errorf("%s: consumer info's time %v, want about %v", tc.name, got, want)
		}
	}

	s, err := natssem.Init(ctx, plain, "skew", 1, natssem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	p, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release(semtest.CleanupContext(t, 10*time.Second)) })
	sk, err := natssem.Open(ctx, skewed, "skew")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sk.Close() })
	for _, tc := range []struct {
		name string
		s    *natssem.Semaphore
		held int
	}{{"plain", s, 1}, {"skewed", sk, 0}} {
		n, err := tc.s.Count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Held != tc.held {
			t.Errorf("%s: Count %+v, want %d held (a 1-minute lease read an hour on)", tc.name, n, tc.held)
		}
	}
}

// TestSkewReaderFrames: a skewReader passes every frame on as it came but
// for the time in a consumer info, and fixes the frame's byte count, however
// the stream is split into reads.
func TestSkewReaderFrames(t *testing.T) {
	// The skewed body is shorter: "05.5Z" becomes "36Z", spaces go.
	const ahead = 90*time.Second + 500*time.Millisecond
	ts := time.Date(2030, 1, 2, 3, 4, 5, 5e8, time.UTC)
	info := fmt.Sprintf(`{"type": %s, "stream_name": "S", "name": "c", "ts": "%s", "num_waiting": 2}`, consumerInfoType, ts.Format(time.RFC3339Nano))
	other := `{"type":"io.nats.jetstream.api.v1.stream_info_response","ts":"2030-01-02T03:04:05Z"}`
	hdr := "NATS/1.0\r\nA: b\r\n\r\n"
	frame := func(op, sub, body string) string {
		if op == "HMSG" {
			return fmt.Sprintf("HMSG %s 7 %d %d\r\n%s%s\r\n", sub, len(hdr), len(hdr)+len(body), hdr, body)
		}
		return fmt.Sprintf("MSG %s 7 _INBOX.r %d\r\n%s\r\n", sub, len(body), body)
	}
	stream := "INFO {\"server_id\":\"x\"}\r\nPING\r\n" +
		frame("MSG", "_INBOX.a", info) + "+OK\r\n" +
		frame("MSG", "_INBOX.b", other) +
		frame("HMSG", "_INBOX.c", info) +
		frame("MSG", "_INBOX.d", "") + "PONG\r\n"

	var skewedTS []time.Time
	for _, split := range []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{{"whole", func(r io.Reader) io.Reader { return r }}, {"bytes", iotest.OneByteReader}, {"halves", iotest.HalfReader}} {
		got, err := io.ReadAll(&skewReader{ahead: ahead, src: split.wrap(bytes.NewReader([]byte(stream)))})
		if err != nil {
			t.Fatal(err)
		}
		// The reader must get the frames, in order, with what each says.
		rest := string(got)
		for _, want := range []string{"INFO {\"server_id\":\"x\"}\r\n", "PING\r\n", "", "+OK\r\n", frame("MSG", "_INBOX.b", other), "", frame("MSG", "_INBOX.d", ""), "PONG\r\n"} {
			if want == "" { // a consumer info: parse it back
				headers, body, n := readFrame(t, rest)
				if headers != "" && headers != hdr {
					t.Errorf("%s: headers %q, want %q", split.name, headers, hdr)
				}
				var ci jetstream.ConsumerInfo
				if err := json.Unmarshal([]byte(body), &ci); err != nil {
					t.Fatalf("%s: consumer info %q: %v", split.name, body, err)
				}
				if ci.Stream != "S" || ci.Name != "c" || ci.NumWaiting != 2 {
					t.Errorf("%s: consumer info %+v lost its fields", split.name, ci)
				}
				skewedTS = append(skewedTS, ci.TimeStamp)
				rest = rest[n:]
				continue
			}
			if !bytes.HasPrefix([]byte(rest), []byte(want)) {
				t.Fatalf("%s: at %q, want %q", split.name, rest, want)
			}
			rest = rest[len(want):]
		}
		if rest != "" {
			t.Errorf("%s: left over %q", split.name, rest)
		}
	}
	for _, got := range skewedTS {
		if !got.Equal(ts.Add(ahead)) {
			t.Errorf("consumer info's time %v, want %v", got, ts.Add(ahead))
		}
	}
}

// readFrame reads the MSG or HMSG frame at the start of s, checking its
// byte counts; it returns the frame's headers, its body and its length.
func readFrame(t *testing.T, s string) (headers, body string, n int) {
	t.Helper()
	eol := bytes.Index([]byte(s), []byte("\r\n"))
	if eol < 0 {
		t.Fatalf("no frame at %q", s)
	}
	f := bytes.Fields([]byte(s[:eol]))
	var hdr, total int
	if _, err := fmt.Sscan(string(f[len(f)-1]), &total); err != nil {
		t.Fatalf("frame %q: %v", s[:eol], err)
	}
	if string(f[0]) == "HMSG" {
		if _, err := fmt.Sscan(string(f[len(f)-2]), &hdr); err != nil {
			t.Fatalf("frame %q: %v", s[:eol], err)
		}
	}
	end := eol + 2 + total
	if len(s) < end+2 || s[end:end+2] != "\r\n" {
		t.Fatalf("frame %q: its byte count %d does not end at its CRLF", s[:eol], total)
	}
	return s[eol+2 : eol+2+hdr], s[eol+2+hdr : end], end + 2
}
