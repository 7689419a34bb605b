package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/freeport"
)

// TestReconcileWatchMetrics: `reconcile --watch --metrics-listen` serves
// the reconciler's runs and findings, and the process's own metrics.
func TestReconcileWatchMetrics(t *testing.T) { forEachBroker(t, testReconcileWatchMetrics) }

func testReconcileWatchMetrics(t *testing.T, b broker) {
	name := uniqueName(t)
	b.mustInit(t, name, 2)
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	p := startSeminit(t, b.env(), "reconcile", "--name", name, "--watch", "100ms", "--metrics-listen", addr)
	want := `tokensem_reconcile_runs_total{result="healthy",semaphore="` + name + `"}`
	deadline := time.Now().Add(30 * time.Second)
	for {
		body := scrape(t, "http://"+addr+"/metrics")
		if strings.Contains(body, want) && strings.Contains(body, "go_goroutines") &&
			strings.Contains(body, `tokensem_reconcile_tokens{semaphore="`+name+`"} 2`) &&
			strings.Contains(body, `tokensem_semaphore_permits{semaphore="`+name+`",state="available"} 2`) &&
			strings.Contains(body, `tokensem_semaphore_utilization{semaphore="`+name+`"} 0`) {
			break
		}
		if p.exited() || time.Now().After(deadline) {
			t.Fatalf("no %s in the metrics (seminit exited: %v)\n%s\nstderr: %s", want, p.exited(), body, p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Announced on stderr, another pipe than the one read above: wait
	// for it to be copied.
	eventually(t, 10*time.Second, "the metrics address announced on stderr", func() bool {
		return strings.Contains(p.stderr.String(), "metrics on http://"+addr+"/metrics")
	})
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return "" // not listening yet
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMetricsListenNeedsWatch(t *testing.T) {
	r := natsBroker().seminit(t, "reconcile", "--name", "x", "--metrics-listen", "127.0.0.1:0")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--metrics-listen needs --watch") {
		t.Fatalf("%v", r)
	}
}

// TestServerMetrics: `seminit server --metrics-listen` serves the embedded
// NATS server's counters.
func TestServerMetrics(t *testing.T) {
	listen, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	p := startSeminit(t, natsBroker().env(), "server", "--listen", listen, "--metrics-listen", metrics)
	p.waitLine(30 * time.Second)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(p.stderr.String(), "metrics on"); {
		if time.Now().After(deadline) || p.exited() {
			t.Fatalf("the metrics address was never announced: %q", p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	b := broker{name: "nats", url: "nats://" + listen, prefix: "TOKENSEM_", leases: true}
	b.mustInit(t, uniqueName(t), 2)
	body := scrape(t, "http://"+metrics+"/metrics")
	for _, want := range []string{"tokensem_nats_connections ", "tokensem_nats_jetstream_streams 2", "process_cpu_seconds_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in the server's metrics:\n%s", want, body)
		}
	}
}
