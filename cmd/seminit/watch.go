package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/natssem"
)

// utilWindow is the span status --watch averages utilization over.
const utilWindow = time.Minute

// watchView is one refresh of status --watch.
type watchView struct {
	Name        string          `json:"name"`
	At          time.Time       `json:"at"`
	Count       tokensem.Count  `json:"count"`
	Utilization float64         `json:"utilization_1m"` // mean held/permits over the last minute of refreshes
	Holders     []watchedHolder `json:"holders"`        // NATS: who holds which slot; empty on RabbitMQ
}

// watchedHolder is a held slot and how long its holder has held it, as far
// as the watch has seen (at least since the watch began).
type watchedHolder struct {
	Index   int           `json:"index"`
	Owner   string        `json:"owner"`
	Held    time.Duration `json:"held_ns"`
	AtLeast bool          `json:"held_before_watch"` // held before the watch began: Held is a lower bound
}

// watchStatus shows a semaphore live until ctx ends (Ctrl-C): its counts
// every interval, the mean utilization over the last minute, and on NATS
// its holders with how long each has held. On a terminal it redraws one
// screen; otherwise (or with --json, one object a line) it appends.
func watchStatus(ctx context.Context, e env, g *globals, s tokensem.Semaphore, name string, every time.Duration) error {
	counter, ok := s.(tokensem.Counter)
	if !ok {
		return usageErr{fmt.Errorf("--watch is not available for this backend")}
	}
	f, isFile := e.stdout.(*os.File)
	tty := isFile && term.IsTerminal(int(f.Fd())) && !g.json
	type sample struct {
		at          time.Time
		util        float64
		haveHolders bool
	}
	var (
		samples []sample
		first   = map[string]time.Time{} // "index owner" -> when the watch first saw it
		start   = time.Now()
	)
	// Holders come from a census only where it reads without taking
	// tokens (NATS): RabbitMQ's census would take every ready token.
	st, census := s.(statuser)
	if _, nats := s.(*natssem.Semaphore); !nats {
		census = false
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, g.opTimeout())
		c, err := counter.Count(cctx)
		var holders []tokensem.Holder
		if err == nil && census {
			var status tokensem.Status
			if status, err = st.Status(cctx); err == nil {
				holders = status.Holders
			}
		}
		cancel()
		if ctx.Err() != nil {
			return nil // interrupted: the normal end of a watch
		}
		now := time.Now()
		v := watchView{Name: name, At: now, Count: c, Holders: []watchedHolder{}}
		if err != nil {
			e.warnf("seminit status: %s\n", oneLine(err))
		} else {
			u := 0.0
			if c.Permits > 0 {
				u = float64(min(c.Held, c.Permits)) / float64(c.Permits)
			}
			samples = append(samples, sample{at: now, util: u})
			for len(samples) > 0 && now.Sub(samples[0].at) > utilWindow {
				samples = samples[1:]
			}
			sum := 0.0
			for _, x := range samples {
				sum += x.util
			}
			v.Utilization = sum / float64(len(samples))
			seen := map[string]bool{}
			for _, h := range holders {
				id := fmt.Sprintf("%d %s", h.Index, h.Owner)
				seen[id] = true
				at, ok := first[id]
				if !ok {
					at, first[id] = now, now
				}
				v.Holders = append(v.Holders, watchedHolder{Index: h.Index, Owner: h.Owner, Held: now.Sub(at).Round(time.Second), AtLeast: at.Sub(start) < every})
			}
			for id := range first {
				if !seen[id] {
					delete(first, id)
				}
			}
			switch {
			case g.json:
				if err := json.NewEncoder(e.stdout).Encode(v); err != nil {
					return err
				}
			default:
				if tty {
					fmt.Fprint(e.stdout, "\033[H\033[2J")
				}
				renderWatch(e.stdout, v, census, every)
				if !tty {
					fmt.Fprintln(e.stdout)
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// renderWatch writes one refresh of status --watch as text.
func renderWatch(w io.Writer, v watchView, holders bool, every time.Duration) {
	c := v.Count
	fmt.Fprintf(w, "%s  %s  (every %v; Ctrl-C ends)\n", v.Name, v.At.Format("15:04:05"), every)
	fmt.Fprintf(w, "  held %d of %d, available %d, waiting %d; utilization over the last minute %.0f%%\n",
		c.Held, c.Permits, c.Available, c.Waiting, 100*v.Utilization)
	if !holders {
		return
	}
	if len(v.Holders) == 0 {
		fmt.Fprintln(w, "  no holders")
		return
	}
	fmt.Fprintf(w, "  %-5s %-32s %s\n", "slot", "holder", "held for")
	for _, h := range v.Holders {
		held := h.Held.String()
		if h.AtLeast {
			held = "≥ " + held // held before the watch began
		}
		fmt.Fprintf(w, "  %-5d %-32s %s\n", h.Index, strings.TrimSpace(h.Owner), held)
	}
}
