package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestLogAxis(t *testing.T) {
	series := []Series{{Label: "a", Samples: []time.Duration{30 * time.Microsecond, 2 * time.Millisecond}}}
	ax := newLogAxis(series, nil, 0, 300)
	if ax.lo != 4 || ax.hi != 7 { // 10 µs .. 10 ms
		t.Fatalf("axis decades %d..%d, want 4..7", ax.lo, ax.hi)
	}
	if x := ax.X(10 * time.Microsecond); x != 0 {
		t.Errorf("X(10µs) = %v, want 0", x)
	}
	if x := ax.X(100 * time.Microsecond); x != 100 {
		t.Errorf("X(100µs) = %v, want 100", x)
	}
	if x := ax.X(10 * time.Millisecond); x != 300 {
		t.Errorf("X(10ms) = %v, want 300", x)
	}
	if x := ax.X(time.Hour); x != 300 {
		t.Errorf("X beyond the axis = %v, want clamped to 300", x)
	}
	prev := -1.0
	for d := 10 * time.Microsecond; d <= 10*time.Millisecond; d = d * 3 / 2 {
		x := ax.X(d)
		if x <= prev {
			t.Fatalf("X not increasing at %v", d)
		}
		prev = x
	}
	// Marks widen the axis.
	ax = newLogAxis(series, []Mark{{At: 100 * time.Millisecond}}, 0, 300)
	if ax.hi != 8 {
		t.Errorf("axis with a 100ms mark ends at decade %d, want 8", ax.hi)
	}
}

func TestDecadeLabel(t *testing.T) {
	for e, want := range map[int]string{3: "1 µs", 4: "10 µs", 5: "100 µs", 6: "1 ms", 8: "100 ms", 9: "1 s"} {
		if got := decadeLabel(e); got != want {
			t.Errorf("decadeLabel(%d) = %q, want %q", e, got, want)
		}
	}
}

func TestCDFPoints(t *testing.T) {
	ds, fs := cdfPoints(seq(1000), 100)
	if len(ds) > 101 || len(ds) < 100 {
		t.Fatalf("%d points, want about 100", len(ds))
	}
	if ds[len(ds)-1] != 1000*time.Millisecond || fs[len(fs)-1] != 1 {
		t.Errorf("last point (%v, %v), want (1s, 1)", ds[len(ds)-1], fs[len(fs)-1])
	}
	if ds[0] != time.Millisecond {
		t.Errorf("first point %v, want 1ms", ds[0])
	}
	for i := 1; i < len(ds); i++ {
		if ds[i] < ds[i-1] || fs[i] <= fs[i-1] {
			t.Fatalf("points not increasing at %d", i)
		}
	}
	ds, fs = cdfPoints(ms(3, 1, 2), 100)
	if len(ds) != 3 || fs[0] != 1.0/3 || fs[2] != 1 {
		t.Errorf("small sample: %v %v", ds, fs)
	}
}

func TestWriteCDF(t *testing.T) {
	var b bytes.Buffer
	series := []Series{
		{Label: "natssem", Samples: ms(1, 2, 3)},
		{Label: "redis <zset> & co", Samples: seq(2000)},
	}
	if err := WriteCDF(&b, "handoff & more", series, handoffMarks()); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	polylines, texts := 0, []string{}
	var inText bool
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, b.String())
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if el.Name.Local == "polyline" {
				polylines++
				for _, a := range el.Attr {
					if a.Name.Local == "points" && len(strings.Fields(a.Value)) > 2*maxPoints+3 {
						t.Errorf("a polyline has %d points", len(strings.Fields(a.Value)))
					}
				}
			}
			inText = el.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(el))
			}
		case xml.EndElement:
			inText = false
		}
	}
	if polylines != 2 {
		t.Errorf("%d polylines, want one per series", polylines)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"handoff & more", "redis <zset> & co — p50", "1 ms", "100 ms", "NATS p50 target 400 µs"} {
		if !strings.Contains(all, want) {
			t.Errorf("plot text lacks %q:\n%s", want, all)
		}
	}
	if err := WriteCDF(&b, "x", nil, nil); err == nil {
		t.Error("WriteCDF with no series: no error")
	}
}
