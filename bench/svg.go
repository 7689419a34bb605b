package main

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Series is one named set of latency samples.
type Series struct {
	Label   string
	Samples []time.Duration
}

// Mark is a vertical reference line.
type Mark struct {
	At    time.Duration
	Label string
}

// Plot geometry, in SVG user units.
const (
	svgW                = 900.0 // the height depends on the legend
	plotL, plotR, plotT = 80.0, 45.0, 50.0
	plotH               = 380.0
	maxPoints           = 400 // per series
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"}

// logAxis maps durations onto [x0, x1] on a log10 scale spanning whole
// decades lo..hi (10^lo .. 10^hi nanoseconds).
type logAxis struct {
	lo, hi int
	x0, x1 float64
}

// newLogAxis spans the decades that contain all samples.
func newLogAxis(series []Series, marks []Mark, x0, x1 float64) logAxis {
	mn, mx := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, d := range s.Samples {
			v := math.Max(float64(d), 1)
			mn, mx = math.Min(mn, v), math.Max(mx, v)
		}
	}
	if math.IsInf(mn, 1) { // no samples: 10 µs .. 1 s
		mn, mx = 1e4, 1e9
	}
	for _, m := range marks {
		v := float64(m.At)
		mn, mx = math.Min(mn, v), math.Max(mx, v)
	}
	lo, hi := int(math.Floor(math.Log10(mn))), int(math.Ceil(math.Log10(mx)))
	if hi <= lo {
		hi = lo + 1
	}
	return logAxis{lo: lo, hi: hi, x0: x0, x1: x1}
}

// X maps d to an x coordinate (clamped to the axis).
func (a logAxis) X(d time.Duration) float64 {
	v := math.Log10(math.Max(float64(d), 1))
	f := (v - float64(a.lo)) / float64(a.hi-a.lo)
	f = math.Min(math.Max(f, 0), 1)
	return a.x0 + f*(a.x1-a.x0)
}

// decadeLabel names 10^e nanoseconds: "10 µs", "1 ms", ...
func decadeLabel(e int) string {
	d := time.Duration(math.Pow10(e))
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	default:
		return fmt.Sprintf("%g s", d.Seconds())
	}
}

// cdfPoints returns the empirical CDF of samples as (duration, fraction)
// points, at most max of them, evenly spaced in rank, always including the
// first and the last sample.
func cdfPoints(samples []time.Duration, max int) ([]time.Duration, []float64) {
	s := slices.Clone(samples)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return nil, nil
	}
	step := 1
	if n > max {
		step = (n + max - 1) / max
	}
	var ds []time.Duration
	var fs []float64
	for i := 0; i < n; i += step {
		ds, fs = append(ds, s[i]), append(fs, float64(i+1)/float64(n))
	}
	if ds[len(ds)-1] != s[n-1] || fs[len(fs)-1] != 1 {
		ds, fs = append(ds, s[n-1]), append(fs, 1)
	}
	return ds, fs
}

// WriteCDF writes an SVG plot of the cumulative distribution of each
// series on a log time axis, with a legend giving p50 and p99, and marks as
// dashed vertical lines.
func WriteCDF(w io.Writer, title string, series []Series, marks []Mark) error {
	if len(series) == 0 {
		return errors.New("svg: no series to plot")
	}
	legendRowH := 20.0
	height := plotT + plotH + 60 + legendRowH*float64(len(series))
	x0, x1 := plotL, svgW-plotR
	y0, y1 := plotT+plotH, plotT // fraction 0 at the bottom
	ax := newLogAxis(series, marks, x0, x1)
	y := func(f float64) float64 { return y0 + f*(y1-y0) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		svgW, height, svgW, height)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="white"/>`+"\n", svgW, height)
	fmt.Fprintf(&b, `<text x="%.0f" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", plotL, html.EscapeString(title))

	// Grid: decades (solid), 2..9 within each decade (faint), fractions.
	for e := ax.lo; e <= ax.hi; e++ {
		x := ax.X(time.Duration(math.Pow10(e)))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#bbb"/>`+"\n", x, y1, x, y0)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, y0+18, html.EscapeString(decadeLabel(e)))
		if e == ax.hi {
			break
		}
		for k := 2; k <= 9; k++ {
			x := ax.X(time.Duration(float64(k) * math.Pow10(e)))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x, y1, x, y0)
		}
	}
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#bbb"/>`+"\n", x0, y(f), x1, y(f))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n", x0-6, y(f)+4, 100*f)
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="2,3"/>`+"\n", x0, y(0.99), x1, y(0.99))
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#777">99%%</text>`+"\n", x1+4, y(0.99)+4)
	for _, m := range marks {
		x := ax.X(m.At)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="6,4"/>`+"\n", x, y1, x, y0)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11" fill="#555" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
			x-4, y0-6, x-4, y0-6, html.EscapeString(m.Label+" "+fmtDur(m.At)))
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", x0, y1, x1-x0, y0-y1)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">latency (log scale)</text>`+"\n", (x0+x1)/2, y0+38)
	fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">share of handoffs at or below</text>`+"\n",
		(y0+y1)/2, (y0+y1)/2)

	for i, s := range series {
		color := palette[i%len(palette)]
		ds, fs := cdfPoints(s.Samples, maxPoints)
		var pts strings.Builder
		// A step CDF: start on the axis at the first sample.
		fmt.Fprintf(&pts, "%.1f,%.1f", ax.X(ds[0]), y(0))
		prev := 0.0
		for j, d := range ds {
			x := ax.X(d)
			fmt.Fprintf(&pts, " %.1f,%.1f %.1f,%.1f", x, y(prev), x, y(fs[j]))
			prev = fs[j]
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`+"\n",
			color, pts.String(), html.EscapeString(s.Label))
		sum := Summarize(s.Samples)
		ly := y0 + 60 + legendRowH*float64(i)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", x0, ly-4, x0+28, ly-4, color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s — p50 %s, p99 %s (%d samples)</text>`+"\n", x0+36, ly,
			html.EscapeString(s.Label), fmtDur(sum.P50), fmtDur(sum.P99), sum.N)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
