package main

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// stopSignals are the signals seminit stops on, or passes on to exec's
// command while it runs.
var stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// A signalRouter hands each stop signal to whoever handles it now: by
// default the first ends the run's context (its cause a signalErr, which
// signalExit turns into 128+N); while exec's command runs, each one goes to
// the command instead (route). A nil router routes nothing.
type signalRouter struct {
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	forward func(syscall.Signal)
}

// listenSignals starts routing the stop signals to ctx's cancel or to a
// forward; stop ends it.
func listenSignals(cancel context.CancelCauseFunc) (r *signalRouter, stop func()) {
	r = &signalRouter{cancel: cancel}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, stopSignals...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sig := range sigs {
			r.deliver(sig.(syscall.Signal))
		}
	}()
	return r, func() {
		signal.Stop(sigs)
		close(sigs)
		<-done
	}
}

func (r *signalRouter) deliver(sig syscall.Signal) {
	r.mu.Lock()
	f := r.forward
	r.mu.Unlock()
	if f != nil {
		f(sig)
		return
	}
	r.cancel(signalErr{sig})
}

// route sends every stop signal to f until restore is called.
func (r *signalRouter) route(f func(syscall.Signal)) (restore func()) {
	if r == nil {
		return func() {}
	}
	r.mu.Lock()
	r.forward = f
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		r.forward = nil
		r.mu.Unlock()
	}
}
