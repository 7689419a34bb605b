package stored

import (
	"errors"
	"strings"
	"testing"

	"github.com/tokensem/tokensem"
)

func TestDecode(t *testing.T) {
	type rec struct {
		N int `json:"n"`
	}
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{"valid", `{"n":1}`, false},
		{"at the cap", `{"n":1}` + strings.Repeat(" ", 57), false},
		{"over the cap", `{"n":1}` + strings.Repeat(" ", 58), true},
		{"not JSON", "\x00\xff", true},
		{"wrong type", `{"n":"x"}`, true},
		{"a number past int64, 1 kB long", `{"n":` + strings.Repeat("9", 1000) + `}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r rec
			err := Decode([]byte(tc.in), 64, &r)
			if (err != nil) != tc.wantErr || err != nil && !errors.Is(err, tokensem.ErrInvalidRecord) {
				t.Fatalf("Decode(%.40q) = %v, want error %v wrapping ErrInvalidRecord", tc.in, err, tc.wantErr)
			}
			if err != nil && len(err.Error()) > 256 {
				t.Errorf("the error quotes too much (%d bytes): %s", len(err.Error()), err)
			}
		})
	}
}

func TestClip(t *testing.T) {
	if got := Clip([]byte("short")); got != `"short"` {
		t.Errorf("Clip(short) = %s", got)
	}
	long := strings.Repeat("a", 100)
	if got, want := Clip([]byte(long)), `"`+long[:ClipLen]+`"… (100 bytes)`; got != want {
		t.Errorf("Clip(100 bytes) = %s, want %s", got, want)
	}
}
