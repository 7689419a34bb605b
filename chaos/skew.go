package chaos

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strconv"
	"time"
)

// skewDialer dials NATS servers for a worker whose view of the server's
// clock is skewed: every consumer info the server sends reads its "ts"
// (the server's time, natssem's takeover clock) ahead by ahead. That is
// what a client sees from a node whose clock is ahead of the node that
// stamped the slot records, or from a server whose clock was stepped
// forward. Plain connections only: it rewrites the protocol as it comes
// off the wire, so TLS would hide it.
type skewDialer struct {
	ahead time.Duration
	net.Dialer
}

// Dial implements nats.CustomDialer.
func (d *skewDialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.Dialer.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &skewConn{Conn: c, r: skewReader{ahead: d.ahead, src: c}}, nil
}

// skewConn is a connection to a NATS server whose reads go through a
// skewReader.
type skewConn struct {
	net.Conn
	r skewReader
}

func (c *skewConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// skewReader reads the NATS protocol from src, server to client, and
// passes it on whole frame by whole frame, moving the "ts" of every
// consumer info response ahead (and the frame's byte counts with it).
type skewReader struct {
	ahead time.Duration
	src   io.Reader
	buf   []byte // for reading src
	in    []byte // read from src, not yet a whole frame
	out   []byte // frames ready for the reader
	err   error  // src's error, returned once out is drained
}

func (r *skewReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if err := r.err; err != nil {
			r.err = nil
			return 0, err
		}
		if r.buf == nil {
			r.buf = make([]byte, 32<<10)
		}
		n, err := r.src.Read(r.buf)
		r.in = append(r.in, r.buf[:n]...)
		r.err = err
		r.frames()
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// frames moves every whole frame at the head of r.in to r.out.
func (r *skewReader) frames() {
	for {
		eol := bytes.Index(r.in, []byte("\r\n"))
		if eol < 0 {
			return
		}
		line := r.in[:eol]
		f := bytes.Fields(line)
		op := ""
		if len(f) > 0 {
			op = string(bytes.ToUpper(f[0]))
		}
		if op != "MSG" && op != "HMSG" {
			r.out = append(r.out, r.in[:eol+2]...)
			r.in = r.in[eol+2:]
			continue
		}
		// MSG <subject> <sid> [reply] <size>
		// HMSG <subject> <sid> [reply] <header size> <total size>
		total, err := strconv.Atoi(string(f[len(f)-1]))
		hdr := 0
		if op == "HMSG" && err == nil && len(f) >= 5 {
			hdr, err = strconv.Atoi(string(f[len(f)-2]))
		}
		if err != nil || hdr > total {
			r.out = append(r.out, r.in...) // not a frame we understand: pass it all on
			r.in = r.in[:0]
			return
		}
		end := eol + 2 + total + 2
		if len(r.in) < end {
			return // the rest of the frame is still on its way
		}
		start := eol + 2
		body := skewConsumerInfo(r.in[start+hdr:start+total], r.ahead)
		head := bytes.Join(f[:len(f)-1], []byte(" "))
		r.out = append(r.out, head...)
		r.out = append(r.out, ' ')
		r.out = strconv.AppendInt(r.out, int64(hdr+len(body)), 10)
		r.out = append(r.out, "\r\n"...)
		r.out = append(r.out, r.in[start:start+hdr]...)
		r.out = append(r.out, body...)
		r.out = append(r.out, "\r\n"...)
		r.in = r.in[end:]
	}
}

// consumerInfoType is the type of the JetStream API's consumer info
// response.
const consumerInfoType = `"io.nats.jetstream.api.v1.consumer_info_response"`

// skewConsumerInfo returns body with its "ts" moved ahead if it is a
// consumer info response, else body itself.
func skewConsumerInfo(body []byte, ahead time.Duration) []byte {
	if !bytes.Contains(body, []byte(consumerInfoType)) {
		return body
	}
	var m map[string]json.RawMessage
	var ts time.Time
	if err := json.Unmarshal(body, &m); err != nil || m["ts"] == nil {
		return body
	}
	if err := json.Unmarshal(m["ts"], &ts); err != nil {
		return body
	}
	skewed, err1 := json.Marshal(ts.Add(ahead))
	m["ts"] = skewed
	out, err2 := json.Marshal(m)
	if errors.Join(err1, err2) != nil {
		return body
	}
	return out
}
