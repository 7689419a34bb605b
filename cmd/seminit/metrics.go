package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newRegistry returns a registry with the Go runtime and process
// collectors, for --metrics-listen.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves reg at http://addr/metrics until ctx ends, and
// announces the address on stderr (stdout carries reports). The returned
// stop waits for the server to end.
func serveMetrics(ctx context.Context, e env, addr string, reg *prometheus.Registry) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, usageErr{fmt.Errorf("--metrics-listen %q: %w", addr, err)}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.warnf("seminit: metrics server: %v\n", err)
		}
	}()
	fmt.Fprintf(e.stderr, "seminit: metrics on http://%s/metrics\n", ln.Addr())
	stopped := context.AfterFunc(ctx, func() { _ = srv.Close() })
	return func() {
		stopped()
		_ = srv.Close()
		<-served
	}, nil
}

// natsCollector exports an embedded NATS server's own counters, read at
// each scrape.
type natsCollector struct {
	ns    *server.Server
	descs map[string]*prometheus.Desc
}

func newNATSCollector(ns *server.Server) *natsCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("tokensem_nats_"+name, help, nil, nil)
	}
	return &natsCollector{ns: ns, descs: map[string]*prometheus.Desc{
		"connections":        d("connections", "Client connections now."),
		"subscriptions":      d("subscriptions", "Subscriptions now."),
		"in_msgs_total":      d("in_msgs_total", "Messages received from clients."),
		"out_msgs_total":     d("out_msgs_total", "Messages sent to clients."),
		"slow_consumers":     d("slow_consumers_total", "Clients dropped or stalled as slow consumers."),
		"jetstream_streams":  d("jetstream_streams", "JetStream streams (two per semaphore: tokens and KV)."),
		"jetstream_messages": d("jetstream_messages", "Messages stored in JetStream."),
		"jetstream_bytes":    d("jetstream_bytes", "Bytes stored in JetStream."),
	}}
}

func (c *natsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *natsCollector) Collect(ch chan<- prometheus.Metric) {
	v, err := c.ns.Varz(nil)
	if err != nil {
		return
	}
	emit := func(name string, t prometheus.ValueType, x float64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], t, x)
	}
	emit("connections", prometheus.GaugeValue, float64(v.Connections))
	emit("subscriptions", prometheus.GaugeValue, float64(v.Subscriptions))
	emit("in_msgs_total", prometheus.CounterValue, float64(v.InMsgs))
	emit("out_msgs_total", prometheus.CounterValue, float64(v.OutMsgs))
	emit("slow_consumers", prometheus.CounterValue, float64(v.SlowConsumers))
	if js, err := c.ns.Jsz(nil); err == nil {
		emit("jetstream_streams", prometheus.GaugeValue, float64(js.Streams))
		emit("jetstream_messages", prometheus.GaugeValue, float64(js.Messages))
		emit("jetstream_bytes", prometheus.GaugeValue, float64(js.Bytes))
	}
}
