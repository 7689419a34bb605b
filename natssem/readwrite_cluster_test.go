package natssem_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// TestClusterResizeSeesItsWrite: on the 3-node cluster with R3, a resize
// through each node in turn, each followed at once by a status through the
// next node, must report the permits just written. A direct get (kv.Get on
// a replicated bucket) may be answered by a replica that has not applied a
// write acknowledged a moment ago; a resize's own census that read the old
// count from one left a retired token in place and reported healthy (a
// loaded run of cmd/seminit's TestClusterResizeReconcileExec), and a
// resize that read the new count where the old one stood did not write it.
func TestClusterResizeSeesItsWrite(t *testing.T) {
	t.Parallel()
	const rounds = 60
	name := fmt.Sprintf("rw-%d", time.Now().UnixNano())
	ctx := semtest.Context(t, 2*time.Minute)
	var sems [3]*natssem.Semaphore
	for i := range sems {
		var err error
		if i == 0 {
			sems[i], err = natssem.Init(ctx, connectCluster(t, i), name, 3, natssem.WithReplicas(3))
		} else {
			sems[i], err = natssem.Open(ctx, connectCluster(t, i), name)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sems[i].Close() })
	}
	for r := range rounds {
		want := 3 + r%2
		rep, err := sems[r%3].Resize(ctx, want)
		if err != nil {
			t.Fatalf("round %d: resize to %d: %v", r, want, err)
		}
		if rep.Permits != want {
			t.Fatalf("round %d: resize to %d through node %d reported %+v", r, want, r%3, rep)
		}
		st, err := sems[(r+1)%3].Status(ctx)
		if err != nil {
			t.Fatalf("round %d: status: %v", r, err)
		}
		if st.Permits != want {
			t.Fatalf("round %d: status through node %d right after a resize to %d: %+v", r, (r+1)%3, want, st)
		}
	}
	// The token scan is read from any replica, so health may lag a moment;
	// a retired token left in place would never go.
	if _, err := sems[0].Resize(ctx, 3); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := sems[2].Status(ctx)
		if err == nil && st.Healthy && st.Permits == 3 && st.Tokens == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy 5 s after the last resize to 3: %+v, %v", st, err)
		}
	}
}

// TestClusterGroupResizeReachesAnIdleClient: on the 3-node cluster with
// R3, a key of a group resized through one node reaches a client on
// another that trusts its cached count by the group's generation
// (generation.go): past the configuration's 2 s it reads the generation
// from the bucket's stream leader, finds it moved, and reads the count.
// Each round the idle client is offered a token of the slot the shrink
// retired; admitting it by its stale count would make two permits of a
// semaphore of one.
func TestClusterGroupResizeReachesAnIdleClient(t *testing.T) {
	t.Parallel()
	name, group := fmt.Sprintf("gen-%d", time.Now().UnixNano()), "gen-cluster"
	ctx := semtest.Context(t, 2*time.Minute)
	admin, err := natssem.Init(ctx, connectCluster(t, 0), name, 2, natssem.WithReplicas(3), natssem.WithGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for round, node := range []int{1, 2} {
		nc := connectCluster(t, node)
		idle, err := natssem.Open(ctx, nc, name, natssem.WithGroup(group))
		if err != nil {
			t.Fatal(err)
		}
		defer idle.Close()
		if _, err := admin.Resize(ctx, 1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2*time.Second + 200*time.Millisecond)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		st, err := admin.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		retired, err := driver.Codec{}.Encode(driver.NewToken(name, 1, st.Epoch))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, natssem.ResourcesOf(name, group).Subject, retired); err != nil {
			t.Fatal(err)
		}
		p, err := idle.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if q, err := idle.TryAcquire(ctx); !errors.Is(err, tokensem.ErrNoPermit) {
			if err == nil {
				_ = q.Release(ctx)
			}
			t.Fatalf("round %d (client on node %d): a second permit after a shrink to 1: TryAcquire = %v", round, node, err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Resize(ctx, 2); err != nil {
			t.Fatal(err)
		}
	}
}
