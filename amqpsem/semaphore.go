package amqpsem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

var _ tokensem.Semaphore = (*Semaphore)(nil)

// Semaphore is a distributed semaphore whose permits are token messages in
// a durable RabbitMQ queue. Create one with Init or Open; it is safe for
// concurrent use.
type Semaphore struct {
	c     *Conn
	name  string
	opts  options
	codec tokensem.Codec
	log   *slog.Logger

	mu     sync.Mutex
	cfg    config
	held   map[int]bool // slots this process holds
	claims map[int]bool // claim queues known to exist
	idle   []*pooledChannel
	closed bool
	done   chan struct{}
}

// config is the semaphore's definition, appended to the config stream
// queue; the entry with the highest Seq is current.
type config struct {
	Version   int    `json:"v"`
	Seq       int    `json:"seq"`
	Permits   int    `json:"permits"`
	Epoch     uint64 `json:"epoch"`
	KeyCheck  string `json:"key_check,omitempty"`
	QueueType string `json:"queue_type"`
	Created   int64  `json:"created_unix_ms"`
}

const configVersion = 1

// Init creates semaphore name with permits tokens, or opens it if it already
// exists with the same number of permits. It is idempotent and safe to run
// from many processes at once: an exclusive lock queue serializes creators,
// so exactly N tokens are published.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrInvalidPermits,
// tokensem.ErrInvalidOption, tokensem.ErrPermitMismatch,
// tokensem.ErrKeyMismatch, tokensem.ErrClosed, or a wrapped broker error.
func Init(ctx context.Context, c *Conn, name string, permits int, opts ...Option) (*Semaphore, error) {
	if err := tokensem.ValidateName(name); err != nil {
		return nil, err
	}
	if err := tokensem.ValidatePermits(permits); err != nil {
		return nil, err
	}
	s, err := newSemaphore(c, name, opts)
	if err != nil {
		return nil, err
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	cfg, err := s.readConfig(ctx)
	switch {
	case err == nil:
		if cfg.Permits != permits {
			return nil, fmt.Errorf("%w: %s has %d permits, not %d", tokensem.ErrPermitMismatch, name, cfg.Permits, permits)
		}
		if err := s.checkKey(cfg); err != nil {
			return nil, err
		}
	case errors.Is(err, tokensem.ErrNotInitialized):
		if cfg, err = s.create(ctx, permits); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	s.cfg = cfg
	return s, nil
}

// Open opens an existing semaphore; only its name is needed.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrInvalidOption,
// tokensem.ErrNotInitialized, tokensem.ErrKeyMismatch, tokensem.ErrClosed,
// or a wrapped broker error.
func Open(ctx context.Context, c *Conn, name string, opts ...Option) (*Semaphore, error) {
	if err := tokensem.ValidateName(name); err != nil {
		return nil, err
	}
	s, err := newSemaphore(c, name, opts)
	if err != nil {
		return nil, err
	}
	cfg, err := s.readConfig(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.checkKey(cfg); err != nil {
		return nil, err
	}
	s.cfg = cfg
	return s, nil
}

func newSemaphore(c *Conn, name string, opts []Option) (*Semaphore, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil connection", tokensem.ErrInvalidOption)
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	return &Semaphore{
		c: c, name: name, opts: o, codec: tokensem.NewCodec(o.Key),
		log: o.Logger.With("semaphore", name), held: make(map[int]bool), claims: make(map[int]bool),
		done: make(chan struct{}),
	}, nil
}

func (s *Semaphore) rtt(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.RequestTimeout)
}

func (s *Semaphore) checkKey(cfg config) error {
	got := s.codec.KeyCheck()
	switch {
	case got == cfg.KeyCheck:
		return nil
	case cfg.KeyCheck == "":
		return fmt.Errorf("%w: %s is unsigned but a key was given", tokensem.ErrKeyMismatch, s.name)
	case got == "":
		return fmt.Errorf("%w: %s has signed tokens; a key is required", tokensem.ErrKeyMismatch, s.name)
	default:
		return fmt.Errorf("%w: %s was created with another key", tokensem.ErrKeyMismatch, s.name)
	}
}

// lock takes the semaphore's creation lock: an exclusive queue, which a
// second connection cannot declare (405 RESOURCE_LOCKED) and which the
// broker deletes if the holder's connection dies.
func (s *Semaphore) lock(ctx context.Context) (func(), error) {
	for {
		ch, _, err := s.c.channel(ctx)
		if err != nil {
			return nil, err
		}
		_, err = ch.QueueDeclare(lockQueue(s.name), false, false, true, false, nil)
		if err == nil {
			return func() {
				_, _ = ch.QueueDelete(lockQueue(s.name), false, false, false)
				_ = ch.Close()
			}, nil
		}
		if !isCode(err, amqp.ResourceLocked) {
			return nil, fmt.Errorf("amqpsem: taking the creation lock of %s: %w", s.name, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("amqpsem: waiting for another Init of %s: %w", s.name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// create publishes the tokens and then the configuration, under the lock.
// Without a configuration nobody can have opened the semaphore, so any
// tokens left by a creator that died half-way are purged first.
func (s *Semaphore) create(ctx context.Context, permits int) (config, error) {
	ch, sess, err := s.c.channel(ctx)
	if err != nil {
		return config{}, err
	}
	defer ch.Close()
	q := QueueName(s.name)
	if _, err := ch.QueueDeclare(q, true, false, false, false, tokenQueueArgs(s.opts.queueType, sess.version)); err != nil {
		if isCode(err, amqp.PreconditionFailed) {
			return config{}, fmt.Errorf("amqpsem: queue %s exists with other settings: %w", q, err)
		}
		return config{}, fmt.Errorf("amqpsem: declare %s: %w", q, err)
	}
	if _, err := ch.QueuePurge(q, false); err != nil {
		return config{}, fmt.Errorf("amqpsem: purge %s: %w", q, err)
	}
	if err := ch.Confirm(false); err != nil {
		return config{}, fmt.Errorf("amqpsem: confirms: %w", err)
	}
	cfg := config{Version: configVersion, Seq: 1, Permits: permits, Epoch: 1, KeyCheck: s.codec.KeyCheck(),
		QueueType: s.opts.queueType, Created: time.Now().UnixMilli()}
	const batch = 1000
	for lo := 0; lo < permits; lo += batch {
		var pending []*amqp.DeferredConfirmation
		for i := lo; i < min(lo+batch, permits); i++ {
			tok := tokensem.NewToken(s.name, i, cfg.Epoch)
			b, err := s.codec.Encode(tok)
			if err != nil {
				return config{}, err
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, ContentType: "text/plain", MessageId: tok.ID, Body: b,
			})
			if err != nil {
				return config{}, fmt.Errorf("amqpsem: publish token: %w", err)
			}
			pending = append(pending, dc)
		}
		if err := waitConfirms(ctx, pending); err != nil {
			return config{}, err
		}
	}
	if err := s.appendConfig(ctx, ch, cfg); err != nil {
		return config{}, err
	}
	s.log.Info("semaphore created", "permits", permits, "queue_type", cfg.QueueType, "server", sess.version)
	return cfg, nil
}

func waitConfirms(ctx context.Context, pending []*amqp.DeferredConfirmation) error {
	for _, dc := range pending {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("amqpsem: waiting for a publisher confirm: %w", err)
		}
		if !ok {
			return errors.New("amqpsem: the broker refused (nacked) a token")
		}
	}
	return nil
}

var streamArgs = amqp.Table{"x-queue-type": "stream"}

// appendConfig adds cfg to the config stream (created if needed) and waits
// for the broker's confirm. ch must be in confirm mode.
func (s *Semaphore) appendConfig(ctx context.Context, ch *amqp.Channel, cfg config) error {
	if _, err := ch.QueueDeclare(configQueue(s.name), true, false, false, false, streamArgs); err != nil {
		return fmt.Errorf("amqpsem: declare config stream: %w", err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", configQueue(s.name), true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: b,
	})
	if err != nil {
		return fmt.Errorf("amqpsem: publish config: %w", err)
	}
	return waitConfirms(ctx, []*amqp.DeferredConfirmation{dc})
}

// configQuiet is how long readConfig waits after the last config entry
// arrived for more of the stream's final chunk.
const configQuiet = 10 * time.Millisecond

// readConfig reads the newest configuration from the config stream, which
// every client can read without consuming it.
func (s *Semaphore) readConfig(ctx context.Context) (config, error) {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return config{}, err
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(configQueue(s.name), true, false, false, false, streamArgs); err != nil {
		if isCode(err, amqp.NotFound) {
			return config{}, fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
		}
		return config{}, fmt.Errorf("amqpsem: config stream of %s: %w", s.name, err)
	}
	if err := ch.Qos(64, 0, false); err != nil {
		return config{}, err
	}
	tag := "tokensem-config-" + tokensem.NewToken(s.name, 0, 1).ID
	// Not ConsumeWithContext: it sends basic.cancel from its own goroutine
	// when the context ends, which can reach the broker after the channel
	// closed, and the broker answers that with a connection error (504).
	deliveries, err := ch.Consume(configQueue(s.name), tag, false, false, false, false,
		amqp.Table{"x-stream-offset": "last"})
	if err != nil {
		return config{}, fmt.Errorf("amqpsem: read config of %s: %w", s.name, err)
	}
	// Cancel the stream consumer and acknowledge what it got before the
	// channel closes.
	var lastTag uint64
	defer func() {
		_ = ch.Cancel(tag, false)
		if lastTag != 0 {
			_ = ch.Ack(lastTag, true)
		}
	}()
	var best config
	found := false
	first := time.NewTimer(min(s.opts.RequestTimeout, time.Second))
	defer first.Stop()
	var quiet <-chan time.Time
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return config{}, fmt.Errorf("amqpsem: config stream of %s closed while reading", s.name)
			}
			lastTag = d.DeliveryTag
			var c config
			if err := json.Unmarshal(d.Body, &c); err == nil && c.Version == configVersion && c.Permits > 0 && c.Seq >= best.Seq {
				best, found = c, true
			}
			quiet = time.After(configQuiet)
		case <-quiet:
			return best, nil
		case <-first.C:
			if !found {
				return config{}, fmt.Errorf("%w: %s has no configuration yet", tokensem.ErrNotInitialized, s.name)
			}
		case <-ctx.Done():
			return config{}, ctx.Err()
		}
	}
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns the number of permits as last read from the broker.
func (s *Semaphore) Permits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Permits
}

func (s *Semaphore) config() config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// Close makes later calls return tokensem.ErrClosed and wakes callers
// blocked in Acquire (they return ErrClosed). Held permits stay valid until
// released or lost. The Conn belongs to the caller and stays open.
func (s *Semaphore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.done)
		for _, pc := range s.idle {
			_ = pc.ch.Close()
		}
		s.idle = nil
	}
	return nil
}

func (s *Semaphore) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// isCode reports whether err is an AMQP error with the given reply code.
func isCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}
