package natssem_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/natssem"
)

// TestResourcesOf: the names ResourcesOf gives are those of the stream,
// consumer, subject and bucket Init made, alone and as a key of a group.
func TestResourcesOf(t *testing.T) {
	for _, group := range []string{"", "resources-group"} {
		name := "resources-of"
		var opts []natssem.Option
		if group != "" {
			opts = append(opts, natssem.WithGroup(group))
		}
		initNATS(t, name, 2, opts...)
		r := natssem.ResourcesOf(name, group)
		js, err := jetstream.New(connect(t, srv.Addr().String()))
		if err != nil {
			t.Fatal(err)
		}
		c, err := js.Consumer(t.Context(), r.Stream, r.Consumer)
		if err != nil {
			t.Fatalf("group %q: consumer %s of stream %s: %v", group, r.Consumer, r.Stream, err)
		}
		if got := c.CachedInfo().Config.FilterSubject; got != "" && got != r.Subject {
			t.Errorf("group %q: consumer filters %s, ResourcesOf says subject %s", group, got, r.Subject)
		}
		st, err := js.Stream(t.Context(), r.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := st.Info(t.Context(), jetstream.WithSubjectFilter(r.Subject)); err != nil || len(n.State.Subjects) != 1 || n.State.Subjects[r.Subject] != 2 {
			t.Errorf("group %q: stream %s holds %v on its subjects, want 2 tokens on %s (%v)", group, r.Stream, n.State.Subjects, r.Subject, err)
		}
		kv, err := js.KeyValue(t.Context(), r.Bucket)
		if err != nil {
			t.Fatalf("group %q: bucket %s: %v", group, r.Bucket, err)
		}
		if _, err := kv.Get(t.Context(), r.KeyPrefix+"config"); err != nil {
			t.Errorf("group %q: record %sconfig in %s: %v", group, r.KeyPrefix, r.Bucket, err)
		}
	}
}
