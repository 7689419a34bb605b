package main

import (
	"context"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
)

// amqpSystem is amqpsem on the RabbitMQ broker at url.
type amqpSystem struct {
	url     string
	version string

	mu    sync.Mutex
	probe *amqp.Connection
	pch   *amqp.Channel

	touchMu sync.Mutex
	touched map[string]map[int]bool // slots whose claim queues a run created
}

func startAMQP(ctx context.Context, url string) (*amqpSystem, error) {
	c, err := amqpsem.Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	version := c.ServerVersion()
	_ = c.Close()
	probe, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	a := &amqpSystem{url: url, version: version, probe: probe, touched: map[string]map[int]bool{}}
	if a.pch, err = probe.Channel(); err != nil {
		_ = probe.Close()
		return nil, err
	}
	return a, nil
}

func (a *amqpSystem) Key() string     { return "amqpsem" }
func (a *amqpSystem) Label() string   { return "amqpsem" }
func (a *amqpSystem) Version() string { return a.version }

func (a *amqpSystem) Connect(ctx context.Context) (Client, error) {
	c, err := amqpsem.Dial(ctx, a.url)
	if err != nil {
		return nil, err
	}
	return amqpClient{a: a, c: c}, nil
}

// channel returns the probe channel, reopening it after a failed passive
// declare closed it.
func (a *amqpSystem) channel() (*amqp.Channel, error) {
	if a.pch != nil && !a.pch.IsClosed() {
		return a.pch, nil
	}
	if a.probe.IsClosed() {
		probe, err := amqp.Dial(a.url)
		if err != nil {
			return nil, err
		}
		a.probe = probe
	}
	ch, err := a.probe.Channel()
	if err != nil {
		return nil, err
	}
	a.pch = ch
	return ch, nil
}

// WaitingLags: the token queue's consumer count trails a release by about
// 1.5 ms (see settledWaiting).
func (a *amqpSystem) WaitingLags() bool { return true }

// Waiting counts the consumers of the token queue: one per waiting caller
// (holders cancel theirs before they claim).
func (a *amqpSystem) Waiting(ctx context.Context, name string) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch, err := a.channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(amqpsem.ResourcesOf(name).Queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Consumers, nil
}

// WaitersPerClient: every waiter has a channel of its own, and RabbitMQ's
// default channel_max is 2047 per connection.
func (a *amqpSystem) WaitersPerClient() int { return 1000 }

// Cleanup deletes the token queue, the configuration queue, the claim
// queues of the slots the run held (claim queues are not auto-deleted) and
// the exchange.
func (a *amqpSystem) Cleanup(ctx context.Context, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := amqpsem.ResourcesOf(name)
	queues := []string{r.Queue, r.ConfigQueue}
	a.touchMu.Lock()
	for i := range a.touched[name] {
		queues = append(queues, r.ClaimPrefix+strconv.Itoa(i))
	}
	delete(a.touched, name)
	a.touchMu.Unlock()
	for _, q := range queues {
		ch, err := a.channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	if ch, err := a.channel(); err == nil {
		_ = ch.ExchangeDelete(r.Exchange, false, false)
	}
}

func (a *amqpSystem) touch(name string, p tokensem.Permit) {
	a.touchMu.Lock()
	defer a.touchMu.Unlock()
	m := a.touched[name]
	if m == nil {
		m = map[int]bool{}
		a.touched[name] = m
	}
	m[p.Token().Index] = true
}

func (a *amqpSystem) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	_ = a.probe.Close()
}

type amqpClient struct {
	a *amqpSystem
	c *amqpsem.Conn
}

func (c amqpClient) Init(ctx context.Context, name string, permits, _ int) (Sem, error) {
	s, err := amqpsem.Init(ctx, c.c, name, permits)
	if err != nil {
		return nil, err
	}
	return tokenSem{s: s, onHold: func(p tokensem.Permit) { c.a.touch(name, p) }}, nil
}

func (c amqpClient) Open(ctx context.Context, name string) (Sem, error) {
	s, err := amqpsem.Open(ctx, c.c, name)
	if err != nil {
		return nil, err
	}
	return tokenSem{s: s, onHold: func(p tokensem.Permit) { c.a.touch(name, p) }}, nil
}

func (c amqpClient) Close() error { return c.c.Close() }
