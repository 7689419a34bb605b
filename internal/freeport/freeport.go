// Package freeport hands tests loopback addresses for servers they start
// (and restart) on a port of their choosing.
//
// A port the kernel picked for a listener on ":0" comes from the ephemeral
// range, the same range it draws the local ports of outgoing connections
// from: between the check and the server's bind (or a restarted server's
// second bind) a connection of any process may take it, and the server
// fails to listen ("server not ready (is the port in use?)" in a loaded
// chaos run). These addresses lie outside that range, where only
// listeners that name their port go.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// lowest is the lowest port handed out: above the well-known and most
// registered services' ports.
const lowest = 20000

var (
	mu    sync.Mutex
	given = map[int]bool{} // ports this process handed out already
)

// Addrs returns n distinct loopback host:ports, each free when checked,
// none in the kernel's ephemeral port range, none handed out before by
// this process.
func Addrs(n int) ([]string, error) {
	lo, hi := pool()
	mu.Lock()
	defer mu.Unlock()
	var out []string
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("freeport: no free port in [%d, %d) outside the ephemeral range after %d tries", lo, hi, tries)
		}
		port := lo + rand.IntN(hi-lo)
		if given[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue // someone's
		}
		_ = l.Close()
		given[port] = true
		out = append(out, addr)
	}
	return out, nil
}

// Addr returns one address as Addrs does.
func Addr() (string, error) {
	a, err := Addrs(1)
	if err != nil {
		return "", err
	}
	return a[0], nil
}

// pool returns the range ports are drawn from: [lowest, start of the
// ephemeral range), or above its end when that leaves more.
func pool() (lo, hi int) {
	elo, ehi := 32768, 60999 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			a, err1 := strconv.Atoi(f[0])
			z, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && a <= z {
				elo, ehi = a, z
			}
		}
	}
	below, above := elo-lowest, 65536-(ehi+1)
	if below >= above && below > 0 {
		return lowest, elo
	}
	if above > 0 {
		return ehi + 1, 65536
	}
	return lowest, 65536 // the ephemeral range covers everything: no better choice
}

// Need returns n addresses as Addrs does, or ends the test.
func Need(tb testing.TB, n int) []string {
	tb.Helper()
	addrs, err := Addrs(n)
	if err != nil {
		tb.Fatal(err)
	}
	return addrs
}
