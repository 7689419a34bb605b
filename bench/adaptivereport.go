package main

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// The adaptive scenario's section of bench.md, its targets and its plot.

// adaptiveRuns returns a system's adaptive run and its N = C run, or nils.
func adaptiveRuns(s *SystemResult) (ad, right *AdaptiveRun) {
	for _, r := range s.Adaptive {
		switch r.Mode {
		case "adaptive":
			ad = r
		case "right":
			right = r
		}
	}
	return ad, right
}

// adaptiveVerdict judges one phase of the adaptive run against the same
// phase of the N = C run, from adaptiveSettle after the change on: the
// count within 20% of C within adaptiveSettle, throughput ≥ 90% and p99
// latency ≤ 2× the N = C run's.
func adaptiveVerdict(ph, ref AdaptivePhase) (ok bool, measured string) {
	if ref.SettledThroughput == 0 || ref.SettledLatency.P99 == 0 {
		return false, fmt.Sprintf("C=%d: the N = C run served nothing from 10 s on", ph.C)
	}
	tp := ph.SettledThroughput / ref.SettledThroughput
	p99 := float64(ph.SettledLatency.P99) / float64(ref.SettledLatency.P99)
	settled := ph.Settled >= 0 && ph.Settled <= adaptiveSettle
	when := "never"
	if ph.Settled >= 0 {
		when = fmtDur(ph.Settled)
	}
	return settled && tp >= 0.9 && p99 <= 2, fmt.Sprintf("C=%d: within 20%% after %s; %.0f%% of the throughput, p99 %.2f×", ph.C, when, 100*tp, p99)
}

// adaptiveTargets adds the adaptive targets, one per system.
func adaptiveTargets(r *Report, add func(sys, goal string, ok, ran bool, measured, why string)) {
	for _, s := range r.Systems {
		if s.Skipped != "" || !s.Tokensem {
			continue
		}
		ad, right := adaptiveRuns(s)
		ran := ad != nil && right != nil && len(ad.Phases) == len(right.Phases)
		ok := ran
		var got []string
		if ran {
			for i, ph := range ad.Phases {
				o, m := adaptiveVerdict(ph, right.Phases[i])
				ok = ok && o
				got = append(got, m)
			}
		}
		why := ""
		if ran && !ok {
			why = "see the adaptive section: figures from 10 s after each change, against N = C in the same phase"
		}
		add(s.Label, "adaptive: N within 20% of C within 10 s of each change; throughput ≥ 90%, p99 ≤ 2× of N = C", ok, ran,
			strings.Join(got, "; "), why)
	}
}

func writeAdaptive(w io.Writer, r *Report) {
	var rows [][]string
	var first *AdaptiveRun
	for _, s := range r.Systems {
		if s.Skipped != "" {
			continue
		}
		if e := s.Errs["adaptive"]; e != "" {
			rows = append(rows, []string{s.Label, "failed: " + e})
		}
		_, right := adaptiveRuns(s)
		for _, run := range s.Adaptive {
			if first == nil {
				first = run
			}
			for i, ph := range run.Phases {
				vs := func(v, ref float64, pct bool) string {
					if right == nil || i >= len(right.Phases) || ref == 0 {
						return ""
					}
					if pct {
						return fmt.Sprintf(" (%.0f%%)", 100*v/ref)
					}
					return fmt.Sprintf(" (%.2f×)", v/ref)
				}
				var rph AdaptivePhase
				if right != nil && i < len(right.Phases) {
					rph = right.Phases[i]
				}
				settled := ""
				if run.Mode == "adaptive" {
					settled = "never"
					if ph.Settled >= 0 {
						settled = fmtDur(ph.Settled)
					}
				}
				rows = append(rows, []string{s.Label, run.label(), fmt.Sprint(ph.C), countsIn(run.Counts, ph.Start, ph.Start+ph.Length),
					fmt.Sprintf("%.0f", ph.Throughput) + vs(ph.Throughput, rph.Throughput, true),
					fmtDur(ph.Latency.P50) + " / " + fmtDur(ph.Latency.P99) + vs(float64(ph.Latency.P99), float64(rph.Latency.P99), false),
					fmt.Sprintf("%.0f", ph.SettledThroughput) + vs(ph.SettledThroughput, rph.SettledThroughput, true),
					fmtDur(ph.SettledLatency.P99) + vs(float64(ph.SettledLatency.P99), float64(rph.SettledLatency.P99), false),
					settled, fmt.Sprintf("%d of %d", run.Peak, run.MostSet)})
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "## Adaptive limits\n\n")
	if first != nil {
		fmt.Fprintf(w, "%d workers in 4 processes loop acquire → use → release in front of a downstream of C servers: a FIFO "+
			"queue served by C workers, each use taking %s. Each worker reports the use's latency (queue wait and service) "+
			"on its permit (tokensem.ReportUse). C changes every %s. Modes: *adaptive* (each process's adaptive.Window "+
			"reports once a %s window over the semaphore's report channel; two processes run an adaptive.Controller "+
			"with Gradient, bounds 1..64, and the one holding a one-permit leader semaphore resizes; the count starts at 4), "+
			"*N = C* (resized to C at each change: the fixed count that is right for each phase, the reference), and fixed "+
			"counts. Latency is the use's, as the downstream's callers see it; \"from 10 s\" columns count only the uses that "+
			"ended from 10 s after the change on. \"Within 20%%\" is when the count came within 20%% of C and stayed "+
			"there to the phase's end. An atomic meter counts the workers holding at once, beside the largest count set.\n\n",
			first.Workers, fmtDur(first.Service), first.Phases[0].Length.Round(time.Second), fmtDur(first.Window))
	}
	writeTable(w, []string{"system", "mode", "C", "counts in the phase", "uses/s (vs N = C)", "latency p50 / p99 (p99 vs N = C)",
		"uses/s from 10 s", "p99 from 10 s", "within 20% after", "most inside / most set"}, rows)
	if plot := adaptivePlotName(r); plot != "" {
		fmt.Fprintf(w, "![permit count over time](%s)\n\n", plot)
	}
}

// countsIn lists the counts a run had in [from, to), as "4→5→6".
func countsIn(counts []CountPoint, from, to time.Duration) string {
	var out []string
	for i, cp := range counts {
		if cp.At >= to || i+1 < len(counts) && counts[i+1].At <= from {
			continue
		}
		out = append(out, fmt.Sprint(cp.N))
	}
	if len(out) > 8 {
		out = append(out[:4], append([]string{"…"}, out[len(out)-3:]...)...)
	}
	return strings.Join(out, "→")
}

// adaptivePlotName is the plot's file name when the report has an
// adaptive run to plot.
func adaptivePlotName(r *Report) string {
	for _, s := range r.Systems {
		if ad, _ := adaptiveRuns(s); ad != nil && s.Skipped == "" {
			return "adaptive.svg"
		}
	}
	return ""
}

// StepSeries is a step function of time: the value From each point on.
type StepSeries struct {
	Label  string
	Points []CountPoint
	Dashed bool
}

// adaptiveSeries is what the plot shows: C, and each system's adaptive
// count.
func adaptiveSeries(r *Report) (series []StepSeries, end time.Duration) {
	for _, s := range r.Systems {
		ad, _ := adaptiveRuns(s)
		if ad == nil || s.Skipped != "" {
			continue
		}
		if len(series) == 0 {
			var cs []CountPoint
			for _, ph := range ad.Phases {
				cs = append(cs, CountPoint{ph.Start, ph.C})
				end = max(end, ph.Start+ph.Length)
			}
			series = append(series, StepSeries{Label: "downstream capacity C", Points: cs, Dashed: true})
		}
		series = append(series, StepSeries{Label: s.Label + ": adaptive count", Points: ad.Counts})
	}
	return series, end
}

// WriteSteps writes an SVG plot of step functions of time on linear axes.
func WriteSteps(w io.Writer, title, yLabel string, series []StepSeries, end time.Duration) error {
	if len(series) == 0 || end <= 0 {
		return errors.New("svg: nothing to plot")
	}
	top := 1
	for _, s := range series {
		for _, p := range s.Points {
			top = max(top, p.N)
		}
	}
	yMax := float64(top) * 1.15
	legendRowH := 20.0
	height := plotT + plotH + 60 + legendRowH*float64(len(series))
	x0, x1 := plotL, svgW-plotR
	y0, y1 := plotT+plotH, plotT
	x := func(d time.Duration) float64 { return x0 + math.Min(1, d.Seconds()/end.Seconds())*(x1-x0) }
	y := func(v float64) float64 { return y0 + v/yMax*(y1-y0) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		svgW, height, svgW, height)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="white"/>`+"\n", svgW, height)
	fmt.Fprintf(&b, `<text x="%.0f" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", plotL, html.EscapeString(title))
	step := 10 * time.Second
	for end/step > 12 {
		step *= 2
	}
	for t := time.Duration(0); t <= end; t += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x(t), y1, x(t), y0)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g s</text>`+"\n", x(t), y0+18, t.Seconds())
	}
	ystep := max(1, int(math.Ceil(yMax/8)))
	for v := 0; float64(v) <= yMax; v += ystep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y(float64(v)), x1, y(float64(v)))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%d</text>`+"\n", x0-6, y(float64(v))+4, v)
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", x0, y1, x1-x0, y0-y1)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">time</text>`+"\n", (x0+x1)/2, y0+38)
	fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">%s</text>`+"\n",
		(y0+y1)/2, (y0+y1)/2, html.EscapeString(yLabel))
	for i, s := range series {
		color := palette[i%len(palette)]
		dash := ""
		if s.Dashed {
			color, dash = "#555", ` stroke-dasharray="6,4"`
		}
		var pts strings.Builder
		for j, p := range s.Points {
			if j > 0 {
				fmt.Fprintf(&pts, " %.1f,%.1f", x(p.At), y(float64(s.Points[j-1].N)))
			}
			fmt.Fprintf(&pts, " %.1f,%.1f", x(p.At), y(float64(p.N)))
		}
		last := s.Points[len(s.Points)-1]
		fmt.Fprintf(&pts, " %.1f,%.1f", x(end), y(float64(last.N)))
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"><title>%s</title></polyline>`+"\n",
			color, dash, strings.TrimSpace(pts.String()), html.EscapeString(s.Label))
		ly := y0 + 60 + legendRowH*float64(i)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/>`+"\n", x0, ly-4, x0+28, ly-4, color, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x0+36, ly, html.EscapeString(s.Label))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
