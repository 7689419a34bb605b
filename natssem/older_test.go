package natssem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/natstest"
	"github.com/tokensem/tokensem/natssem"
)

// TestOlderServer: a semaphore on nats-server before 2.12 (a process of
// natstest.OlderServer, built from the module proxy): it serves waits in
// class 0, by TryAcquire and through a waiter's handoff, with pulls that
// name the priority group its consumer does not have; it refuses other
// classes; and its Status counts every token. On 2.11, a batched direct
// get from a sequence the stream no longer holds is answered 404 unless it
// names a subject, and Status read no token at all. Alone and as a key of
// a group.
func TestOlderServer(t *testing.T) {
	url := natstest.StartOlder(t, natstest.OlderServer)
	for _, tc := range []struct {
		name string
		opts []natssem.Option
	}{
		{name: "alone"},
		{name: "group", opts: []natssem.Option{natssem.WithGroup("older")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			dial := func() *nats.Conn {
				nc, err := nats.Connect(url)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				return nc
			}
			if v := dial().ConnectedServerVersion(); v != natstest.OlderServer[1:] {
				t.Fatalf("server version %s, want %s", v, natstest.OlderServer)
			}
			const permits = 2
			s, err := natssem.Init(ctx, dial(), "older-"+tc.name, permits, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			w, err := natssem.Open(ctx, dial(), "older-"+tc.name, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()

			st, err := s.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Tokens != permits || st.Available != permits || !st.Healthy {
				t.Fatalf("Status after Init: %d tokens, %d available, healthy %v, missing %v; want %d, %d, true",
					st.Tokens, st.Available, st.Healthy, st.Missing, permits, permits)
			}
			if _, err := s.Acquire(tokensem.WithPriority(ctx, 1)); !errors.Is(err, tokensem.ErrPriorityUnsupported) {
				t.Fatalf("a class 1 wait: %v, want ErrPriorityUnsupported", err)
			}
			var held []tokensem.Permit
			for range permits {
				p, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatalf("TryAcquire: %v", err)
				}
				held = append(held, p)
			}
			if st, err = s.Status(ctx); err != nil || st.Held != permits {
				t.Fatalf("Status with every permit held: %+v, %v", st, err)
			}
			handOff(t, ctx, held[0], s, w)
			if err := held[1].Release(ctx); err != nil {
				t.Fatal(err)
			}
			if st, err = s.Status(ctx); err != nil || st.Tokens != permits || st.Available != permits || !st.Healthy {
				t.Fatalf("Status at the end: %+v, %v", st, err)
			}
		})
	}
}
