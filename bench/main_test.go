package main

import (
	"io"
	"slices"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantErr   bool
		systems   []string
		scenarios []string
		duration  time.Duration
	}{
		{name: "defaults", systems: allSystems, scenarios: allScenarios, duration: 10 * time.Second},
		{name: "quick", args: []string{"-quick"}, systems: allSystems, scenarios: allScenarios, duration: 3 * time.Second},
		{name: "subset keeps the canonical order", args: []string{"-systems", "redis, natssem", "-scenarios", "handoff,cycle"},
			systems: []string{"natssem", "redis"}, scenarios: []string{"cycle", "handoff"}, duration: 10 * time.Second},
		{name: "all", args: []string{"-systems", "all"}, systems: allSystems, scenarios: allScenarios, duration: 10 * time.Second},
		{name: "unknown system", args: []string{"-systems", "etcd"}, wantErr: true},
		{name: "empty scenarios", args: []string{"-scenarios", ","}, wantErr: true},
		{name: "bad workers", args: []string{"-workers", "0"}, wantErr: true},
		{name: "stray argument", args: []string{"extra"}, wantErr: true},
		{name: "a cluster of its own and a server", args: []string{"-nats-cluster", "-nats-url", "nats://x"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args, io.Discard)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if !slices.Equal(c.systems, tt.systems) || !slices.Equal(c.scenarios, tt.scenarios) || c.duration != tt.duration {
				t.Errorf("systems %v scenarios %v duration %v", c.systems, c.scenarios, c.duration)
			}
		})
	}
}

func TestCommand(t *testing.T) {
	c := &config{args: []string{"-quick", "-out", "../docs", "-amqp-url", "amqp://a b"}}
	if got, want := c.command(), `cd bench && go run . -quick -out ../docs -amqp-url "amqp://a b"`; got != want {
		t.Errorf("command = %s, want %s", got, want)
	}
}
