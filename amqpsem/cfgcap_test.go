package amqpsem_test

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
)

// heapCost runs fn and returns the most the heap grew above its size
// before fn (sampled every 2 ms) and the bytes fn's process allocated
// meanwhile.
func heapCost(fn func()) (peak, total uint64) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > before.HeapAlloc {
				peak = max(peak, m.HeapAlloc-before.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	close(done)
	<-watched
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	return peak, after.TotalAlloc - before.TotalAlloc
}

// publishConfig publishes body into semaphore n's configuration queue
// through its exchange, as its admin could, and returns whether the broker
// confirmed it.
func (p place) publishConfig(t *testing.T, n string, body []byte) bool {
	t.Helper()
	ch := p.channel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "tokensem."+n+".x", "tokensem."+n+".cfg", true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	ok, err := dc.WaitContext(semtest.Context(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

const oversized = 60_000_017 // the review's record

// TestOversizedConfigNotKept: a 60 MB message published into a
// semaphore's configuration queue (issue 33: it made every read of the
// configuration take 300 MB and time out) does not stay there: the queue's
// cap drops it (RabbitMQ 3.10.8 confirms the publish, then drops it, and the
// configuration queued before it, unless a reader held that one then).
// Open then costs less than 10 MB and says what is wrong (or, if the
// configuration survived, works), List lists the semaphore, and
// ForceDelete removes it.
func TestOversizedConfigNotKept(t *testing.T) {
	// In a vhost of its own: the semaphore it leaves invalid for a while
	// would slow every List beside it.
	p := vhostPlace(t)
	n := name(t)
	p.init(t, n, 2)
	ok := p.publishConfig(t, n, bytes.Repeat([]byte("x"), oversized))
	t.Logf("publish of %d bytes: confirmed %v", oversized, ok)

	c := p.dial(t)
	// The broker may take seconds to store and drop 60 MB on a loaded
	// machine, and a read with a 1 s request timeout then finds it silent
	// (ErrUnavailable): read again until it answers, measuring every try.
	var err error
	var peak, total uint64
	for try := 1; ; try++ {
		p, a := heapCost(func() {
			_, err = amqpsem.Open(t.Context(), c, n, amqpsem.WithRequestTimeout(time.Second))
		})
		peak, total = max(peak, p), total+a
		if !errors.Is(err, tokensem.ErrUnavailable) || try == 20 {
			break
		}
		t.Logf("open %d after the publish: %v", try, err)
	}
	t.Logf("open after the publish: heap grew by at most %d kB, %d kB allocated; %v", peak>>10, total>>10, err)
	if err != nil && !errors.Is(err, tokensem.ErrInvalidRecord) {
		t.Errorf("open: %v, want it to work or ErrInvalidRecord", err)
	}
	if peak > 10<<20 {
		t.Errorf("open after a %d-byte publish: the heap grew by %d MB, want under 10 MB", oversized, peak>>20)
	}
	// The heap is measured: the rest, which waits on the broker (the List
	// and the force delete read the configuration until they give up on
	// it), runs beside the package's other parallel tests.
	t.Parallel()
	infos, err := amqpsem.List(t.Context(), c)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	found := false
	for _, in := range infos {
		if in.Name == n {
			found = true
			t.Logf("listed: %+v", in)
		}
	}
	if !found {
		t.Errorf("list: %s missing from %+v", n, infos)
	}
	if err := amqpsem.ForceDelete(semtest.Context(t, time.Minute), c, n); err != nil {
		t.Fatalf("force delete: %v", err)
	}
}

// declareUncapped makes semaphore n's configuration queue without the cap
// (a quorum queue, with the delivery limit off on 4.x), as a user allowed
// to configure it could, and binds it to the semaphore's exchange.
func (p place) declareUncapped(t *testing.T, n string) {
	t.Helper()
	args := amqp.Table{"x-queue-type": "quorum"}
	if strings.HasPrefix(dialServerVersion(t), "4.") {
		args["x-delivery-limit"] = int64(-1)
	}
	ch := p.channel(t)
	q := "tokensem." + n + ".cfg"
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("tokensem."+n+".x", amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q, q, "tokensem."+n+".x", false, nil); err != nil {
		t.Fatal(err)
	}
}

// TestForeignConfigQueueRefused: an empty configuration queue made without
// the cap (by someone else: amqpsem makes one layout) fails Init with an
// error that names the queue and Delete, and Delete removes it.
func TestForeignConfigQueueRefused(t *testing.T) {
	n := name(t)
	defaultPlace().declareUncapped(t, n)
	c := dial(t, broker.Addr, 0)
	t.Cleanup(func() { _ = amqpsem.ForceDelete(semtest.CleanupContext(t, time.Minute), c, n) })
	ctx := semtest.Context(t, time.Minute)
	_, err := amqpsem.Init(ctx, c, n, 2)
	if err == nil || !strings.Contains(err.Error(), "tokensem."+n+".cfg exists with other settings (Delete removes it)") {
		t.Fatalf("init over an uncapped configuration queue: %v, want it refused, naming the queue and Delete", err)
	}
	if err := amqpsem.Delete(ctx, c, n); err != nil {
		t.Fatalf("delete: %v", err)
	}
	s := initAMQP(t, n, 2)
	if st, err := s.Status(ctx); err != nil || !st.Healthy || st.Permits != 2 {
		t.Fatalf("status after the delete and a new Init: %+v, %v", st, err)
	}
}

// TestUncappedConfigQueue: a 20 MB message in a configuration queue made
// again without the cap (by a user allowed to configure it), where the cap
// does not protect, is received once by a read (which refuses it), not
// again at every retry.
func TestUncappedConfigQueue(t *testing.T) {
	// In a vhost of its own: a List would read its configuration, which
	// counts a delivery of the message this test counts. Not parallel:
	// beside the other tests and two CPU hogs, Open's read of 20 MB
	// outlasted its request timeout and was tried again (a second
	// delivery).
	p := vhostPlace(t)
	n := name(t)
	p.init(t, n, 2)
	if _, err := p.channel(t).QueueDelete("tokensem."+n+".cfg", false, false, false); err != nil {
		t.Fatal(err)
	}
	p.declareUncapped(t, n)
	const size = 20 << 20
	if !p.publishConfig(t, n, bytes.Repeat([]byte("x"), size)) {
		t.Fatal("20 MB publish into an uncapped queue refused")
	}
	c := p.dial(t)
	var err error
	peak, total := heapCost(func() { _, err = amqpsem.Open(t.Context(), c, n) })
	t.Logf("open over a %d-byte configuration: heap grew by at most %d kB, %d kB allocated; %v", size, peak>>10, total>>10, err)
	if !errors.Is(err, tokensem.ErrInvalidRecord) {
		t.Errorf("open: %v, want ErrInvalidRecord", err)
	}
	// A quorum queue counts the returns of a message in its
	// x-delivery-count: Open's read took it once. Its close returns the
	// message, which the queue takes back a moment later (20 MB: longer
	// on a loaded machine).
	ch := p.channel(t)
	d, got, err := ch.Get("tokensem."+n+".cfg", false)
	for deadline := time.Now().Add(20 * time.Second); err == nil && !got && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		d, got, err = ch.Get("tokensem."+n+".cfg", false)
	}
	if err != nil || !got {
		t.Fatalf("get the 20 MB message: %v, %v", got, err)
	}
	if returns := d.Headers["x-delivery-count"]; returns != int64(1) {
		t.Errorf("the message was returned %v times (x-delivery-count) by one Open, want 1: received again at each retry", returns)
	}
}

// TestListSurvivesUnreadable: a semaphore whose configuration cannot be
// read (here: someone holds its message and never lets go) is listed as
// "unreadable" with the reason, and the others are listed as ever; before,
// the whole List failed.
func TestListSurvivesUnreadable(t *testing.T) {
	p := ownPlace(t) // a List reads the whole vhost
	ok, stuck := name(t)+"-ok", name(t)+"-stuck"
	p.init(t, ok, 1)
	p.init(t, stuck, 1)
	ch := p.channel(t)
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("tokensem."+stuck+".cfg", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-ds // held, unacknowledged, until the test ends
	infos, err := amqpsem.List(semtest.Context(t, time.Minute), p.dial(t))
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	got := map[string]tokensem.Info{}
	for _, in := range infos {
		got[in.Name] = in
	}
	if in := got[ok]; in.State != "ready" || in.Permits != 1 {
		t.Errorf("list: %s as %+v, want ready with 1 permit", ok, in)
	}
	if in := got[stuck]; in.State != "unreadable" || !strings.Contains(in.Warning, "could not be read") {
		t.Errorf("list: %s as %+v, want unreadable with the reason", stuck, in)
	}
	t.Logf("listed: %+v", got[stuck])
}
