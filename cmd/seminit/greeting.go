package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// greetingWait bounds how long seminit waits for a NATS server's greeting
// (its INFO line, which a server sends the moment it accepts a connection)
// before it calls the port something else. A RabbitMQ port accepts a
// connection and waits, silent, for the client to speak first.
const greetingWait = 2 * time.Second

// greetingDialer dials a NATS URL for nats.SetCustomDialer and checks that
// what answers is a NATS server: a port that stays silent or greets in
// another protocol fails at once, saying so, instead of after the request
// timeout with "i/o timeout".
type greetingDialer struct {
	timeout time.Duration // of the TCP connect
}

func (g greetingDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, g.timeout)
	if err != nil {
		return nil, err
	}
	wait := min(greetingWait, g.timeout)
	_ = c.SetReadDeadline(time.Now().Add(wait))
	r := bufio.NewReader(c)
	first, err := r.Peek(4)
	_ = c.SetReadDeadline(time.Time{})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		_ = c.Close()
		return nil, fmt.Errorf("the port accepted the connection but sent no NATS greeting within %v: is it a NATS port? (RabbitMQ's is 5672: give it an amqp:// URL)", wait)
	case err != nil:
		_ = c.Close()
		return nil, err
	case string(first) != "INFO":
		_ = c.Close()
		return nil, fmt.Errorf("the port answered %q, not a NATS greeting: is it a NATS port?", first)
	}
	return peekedConn{Conn: c, r: r}, nil
}

// peekedConn is a connection whose first bytes were read ahead into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c peekedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
