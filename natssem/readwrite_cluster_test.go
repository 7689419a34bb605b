package natssem_test

import (
	"fmt"
	"testing"
	"time"

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
