package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrsOutsideEphemeralRange(t *testing.T) {
	lo, hi := pool()
	addrs, err := Addrs(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
		_, p, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < lo || port >= hi {
			t.Errorf("%s outside [%d, %d)", a, lo, hi)
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Errorf("%s is not free: %v", a, err)
			continue
		}
		_ = l.Close()
	}
	more, err := Addrs(1)
	if err != nil {
		t.Fatal(err)
	}
	if seen[more[0]] {
		t.Errorf("%s handed out again", more[0])
	}
}
