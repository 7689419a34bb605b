package embedded_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem/natssem/embedded"
)

func TestStartRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  embedded.Config
	}{
		{"password without user", embedded.Config{Password: "p"}},
		{"listen without port", embedded.Config{Listen: "127.0.0.1"}},
		{"listen port out of range", embedded.Config{Listen: "127.0.0.1:70000"}},
		{"unknown sync policy", embedded.Config{Sync: 9}},
		{"sync period with always", embedded.Config{Sync: embedded.SyncAlways, SyncEvery: time.Second}},
		{"sync period with default", embedded.Config{SyncEvery: time.Second}},
		{"negative sync period", embedded.Config{Sync: embedded.SyncInterval, SyncEvery: -time.Second}},
		{"routes without cluster", embedded.Config{Routes: []string{"nats-route://127.0.0.1:6222"}}},
		{"cluster name without cluster", embedded.Config{ClusterName: "c"}},
		{"cluster without server name", embedded.Config{StoreDir: t.TempDir(), ClusterListen: "127.0.0.1:0",
			Routes: []string{"nats-route://127.0.0.1:6222"}}},
		{"cluster without routes", embedded.Config{StoreDir: t.TempDir(), ServerName: "n0", ClusterListen: "127.0.0.1:0"}},
		{"cluster on a temporary store", embedded.Config{ServerName: "n0", ClusterListen: "127.0.0.1:0",
			Routes: []string{"nats-route://127.0.0.1:6222"}}},
		{"cluster listen without port", embedded.Config{StoreDir: t.TempDir(), ServerName: "n0", ClusterListen: "127.0.0.1",
			Routes: []string{"nats-route://127.0.0.1:6222"}}},
		{"route with client scheme", embedded.Config{StoreDir: t.TempDir(), ServerName: "n0", ClusterListen: "127.0.0.1:0",
			Routes: []string{"nats://127.0.0.1:6222"}}},
		{"route without port", embedded.Config{StoreDir: t.TempDir(), ServerName: "n0", ClusterListen: "127.0.0.1:0",
			Routes: []string{"nats-route://127.0.0.1"}}},
		{"route port zero", embedded.Config{StoreDir: t.TempDir(), ServerName: "n0", ClusterListen: "127.0.0.1:0",
			Routes: []string{"nats-route://127.0.0.1:0"}}},
		{"server name with a space (nats-server's own check)", embedded.Config{ServerName: "n 0"}},
		{"cluster name with a space (nats-server's own check)", embedded.Config{StoreDir: t.TempDir(), ServerName: "n0",
			ClusterListen: "127.0.0.1:0", ClusterName: "a b", Routes: []string{"nats-route://127.0.0.1:6222"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := embedded.Start(tt.cfg)
			if err == nil {
				s.Shutdown()
				t.Fatal("Start succeeded")
			}
			if !errors.Is(err, embedded.ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestSyncDefault(t *testing.T) {
	tests := []struct {
		name       string
		cfg        embedded.Config
		wantPolicy embedded.SyncPolicy
		wantEvery  time.Duration
	}{
		{"temporary store", embedded.Config{}, embedded.SyncInterval, embedded.DefaultSyncEvery},
		{"kept store", embedded.Config{StoreDir: t.TempDir()}, embedded.SyncAlways, 0},
		{"interval on a kept store", embedded.Config{StoreDir: t.TempDir(), Sync: embedded.SyncInterval},
			embedded.SyncInterval, embedded.DefaultSyncEvery},
		{"always on a temporary store", embedded.Config{Sync: embedded.SyncAlways}, embedded.SyncAlways, 0},
		{"interval with a period", embedded.Config{Sync: embedded.SyncInterval, SyncEvery: time.Second},
			embedded.SyncInterval, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := embedded.Start(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Shutdown()
			if p, every := s.Sync(); p != tt.wantPolicy || every != tt.wantEvery {
				t.Fatalf("Sync() = %v, %v; want %v, %v", p, every, tt.wantPolicy, tt.wantEvery)
			}
		})
	}
}

func TestSyncPolicyText(t *testing.T) {
	for _, want := range []embedded.SyncPolicy{embedded.SyncAlways, embedded.SyncInterval} {
		text, _ := want.MarshalText()
		var got embedded.SyncPolicy
		if err := got.UnmarshalText(text); err != nil || got != want {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, got, err, want)
		}
	}
	for _, bad := range []string{"", "default", "Always", "2m"} {
		var p embedded.SyncPolicy
		if err := p.UnmarshalText([]byte(bad)); !errors.Is(err, embedded.ErrInvalidConfig) {
			t.Errorf("UnmarshalText(%q) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// TestStartNamesWhatFailed: a server that cannot start (its port taken,
// its store not creatable) fails Start with the server's own reason,
// without waiting out ReadyTimeout (it used to wait, then blame the port).
func TestStartNamesWhatFailed(t *testing.T) {
	first, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Shutdown()
	taken := strings.TrimPrefix(first.URL(), "nats://")
	tests := []struct {
		name string
		cfg  embedded.Config
		want string
	}{
		{"port in use", embedded.Config{Listen: taken}, "address already in use"},
		{"store not creatable", embedded.Config{Listen: "127.0.0.1:0", StoreDir: "/proc/no-such-store"}, "storage directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.ReadyTimeout = time.Minute // a wait out would fail the test's deadline, not pass it
			s, err := embedded.Start(tt.cfg)
			if err == nil {
				s.Shutdown()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) || errors.Is(err, embedded.ErrInvalidConfig) {
				t.Fatalf("err = %v, want the server's reason (%q)", err, tt.want)
			}
		})
	}
}
