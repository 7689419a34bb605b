// Package faultproxy provides a small loopback TCP proxy for fault-injection
// tests. Clients connect to a broker (NATS, RabbitMQ, ...) through the proxy,
// which lets a test freeze (Pause/Resume) or sever (Cut) a client's network
// path without touching the broker itself.
package faultproxy
