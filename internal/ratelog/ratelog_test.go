package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLimited(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	l := &Limited{Every: time.Hour}
	for range 5 {
		l.Warn(log, "bad report", "n", 1)
	}
	if got := strings.Count(buf.String(), "bad report"); got != 1 {
		t.Fatalf("5 warnings within the interval logged %d times:\n%s", got, buf.String())
	}
	l.mu.Lock()
	l.last = time.Now().Add(-2 * time.Hour) // the interval has passed
	l.mu.Unlock()
	l.Warn(log, "bad report")
	if !strings.Contains(buf.String(), "suppressed=4") {
		t.Fatalf("the next record does not count the 4 held back:\n%s", buf.String())
	}
}
