package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/rabbittest"
)

// TestDeleteRemovesClaimsACutShortDeleteLeft: a delete cut short after
// the configuration and the token queue went (they go first) leaves claim
// queues; a later Delete removes them. A claim someone holds (a holder
// that got its token just before the token queue went) is kept until its
// holder has passed W and a third, since it keeps that holder out of the
// name's next life; then it goes too.
func TestDeleteRemovesClaimsACutShortDeleteLeft(t *testing.T) {
	t.Parallel() // the held case waits W and a third
	b := rabbittest.Need(t)
	ctx := t.Context()
	c, err := Dial(ctx, b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	const permits = 3
	// cutShort makes semaphore name and removes what a delete removes
	// before its claim queues.
	cutShort := func(t *testing.T) string {
		t.Helper()
		name := "cut-delete-" + ids.New()[:8]
		s, err := Init(ctx, c, name, permits)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		t.Cleanup(func() { _ = ForceDelete(context.Background(), c, name) })
		ch, err := raw.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		for _, q := range []string{configQueue(name), tokenQueue(name)} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Fatal(err)
			}
		}
		return name
	}

	t.Run("free", func(t *testing.T) {
		name := cutShort(t)
		if err := Delete(ctx, c, name); err != nil {
			t.Fatalf("delete: %v", err)
		}
		nothingLeft(t, b.URL, name, permits)
	})

	t.Run("held", func(t *testing.T) {
		name := cutShort(t)
		// A holder of slot 1: an exclusive consumer on its claim queue.
		ch, err := raw.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		cancelled := ch.NotifyCancel(make(chan string, 1))
		if _, err := ch.Consume(claimQueue(name, 1), claimTag, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		went := make(chan time.Duration, 1)
		go func() {
			<-cancelled // closed with ch
			went <- time.Since(start)
		}()
		if err := Delete(ctx, c, name); err != nil {
			t.Fatalf("delete: %v", err)
		}
		// The bound of a Conn with DefaultHeartbeat, as Dial made c.
		wait := config{HoldBoundMS: holdBoundOf(DefaultHeartbeat).Milliseconds()}.holdWait()
		select {
		case d := <-went:
			if d < wait {
				t.Errorf("the held claim went %v after the delete began, want at least W and a third (%v)", d, wait)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("the holder's claim was not cancelled")
		}
		nothingLeft(t, b.URL, name, permits)
	})
}

// nothingLeft fails t if any queue or the exchange of semaphore name (with
// the claim queues of slots [0, slots) and two more) still exists once a
// few seconds have passed: the lock queue goes with its holder's release,
// which may follow the call's return.
func nothingLeft(t *testing.T, url, name string, slots int) {
	t.Helper()
	var left []string
	for end := time.Now().Add(5 * time.Second); ; {
		var err error
		if left, err = resourcesLeft(url, name, slots+2); err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if len(left) == 0 || time.Now().After(end) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("%s: left on the broker: %v", name, left)
	}
}

// resourcesLeft returns the queues and exchange of semaphore name (claim
// queues of slots [0, slots)) that exist, by passive declares on a
// connection of its own: a queue another connection holds exclusively
// (405) exists.
func resourcesLeft(url, name string, slots int) ([]string, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r := ResourcesOf(name)
	queues := []string{r.Queue, r.ConfigQueue, r.LockQueue}
	for i := range slots {
		queues = append(queues, claimQueue(name, i))
	}
	var left []string
	look := func(what string, declare func(*amqp.Channel) error) error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		err = declare(ch)
		var ae *amqp.Error
		switch {
		case err == nil, errors.As(err, &ae) && ae.Code == amqp.ResourceLocked:
			left = append(left, what)
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		default:
			return fmt.Errorf("passive declare of %s: %w", what, err)
		}
		return nil
	}
	for _, q := range queues {
		if err := look(q, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
			return err
		}); err != nil {
			return nil, err
		}
	}
	err = look(r.Exchange, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(r.Exchange, amqp.ExchangeDirect, true, false, false, false, nil)
	})
	return left, err
}
