package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

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
			fmt.Fprintf(e.stderr, "seminit: metrics server: %v\n", err)
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
