package tokensem_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

func TestDefaultOptions(t *testing.T) {
	o := tokensem.DefaultOptions()
	if o.Lease != tokensem.DefaultLease {
		t.Errorf("Lease = %v, want %v", o.Lease, tokensem.DefaultLease)
	}
	if o.RequestTimeout != tokensem.DefaultRequestTimeout {
		t.Errorf("RequestTimeout = %v, want %v", o.RequestTimeout, tokensem.DefaultRequestTimeout)
	}
	if o.Key != nil {
		t.Errorf("Key = %q, want nil", o.Key)
	}
	if o.Logger == nil {
		t.Error("Logger is nil")
	} else {
		o.Logger.Info("discarded") // must not panic
	}
	if o.HolderName == "" || !strings.Contains(o.HolderName, ":") {
		t.Errorf("HolderName = %q, want host:pid", o.HolderName)
	}
	if len(o.HolderName) > 128 {
		t.Errorf("HolderName %q is longer than WithHolderName allows", o.HolderName)
	}
	// The defaults must themselves pass the option checks.
	for _, opt := range []tokensem.Option{
		tokensem.WithLease(o.Lease),
		tokensem.WithLogger(o.Logger),
		tokensem.WithHolderName(o.HolderName),
		tokensem.WithRequestTimeout(o.RequestTimeout),
	} {
		if err := opt(&o); err != nil {
			t.Errorf("a default is rejected by its own option: %v", err)
		}
	}
}

func TestOptions(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	key16 := bytes.Repeat([]byte{'k'}, 16)
	tests := []struct {
		name    string
		opt     tokensem.Option
		check   func(tokensem.Options) bool // for accepted options
		wantErr error
	}{
		{"lease default", tokensem.WithLease(tokensem.DefaultLease), func(o tokensem.Options) bool { return o.Lease == tokensem.DefaultLease }, nil},
		{"lease min", tokensem.WithLease(tokensem.MinLease), func(o tokensem.Options) bool { return o.Lease == tokensem.MinLease }, nil},
		{"lease max", tokensem.WithLease(tokensem.MaxLease), func(o tokensem.Options) bool { return o.Lease == tokensem.MaxLease }, nil},
		{"lease below min", tokensem.WithLease(tokensem.MinLease - time.Nanosecond), nil, tokensem.ErrInvalidOption},
		{"lease above max", tokensem.WithLease(tokensem.MaxLease + time.Nanosecond), nil, tokensem.ErrInvalidOption},
		{"lease zero", tokensem.WithLease(0), nil, tokensem.ErrInvalidOption},
		{"lease negative", tokensem.WithLease(-time.Second), nil, tokensem.ErrInvalidOption},

		{"key 16 bytes", tokensem.WithKey(key16), func(o tokensem.Options) bool { return bytes.Equal(o.Key, key16) }, nil},
		{"key 64 bytes", tokensem.WithKey(bytes.Repeat([]byte{1}, 64)), func(o tokensem.Options) bool { return len(o.Key) == 64 }, nil},
		{"key 15 bytes", tokensem.WithKey(key16[:15]), nil, tokensem.ErrInvalidOption},
		{"key empty", tokensem.WithKey([]byte{}), nil, tokensem.ErrInvalidOption},
		{"key nil", tokensem.WithKey(nil), nil, tokensem.ErrInvalidOption},

		{"logger", tokensem.WithLogger(logger), func(o tokensem.Options) bool { return o.Logger == logger }, nil},
		{"logger nil", tokensem.WithLogger(nil), nil, tokensem.ErrInvalidOption},

		{"holder name", tokensem.WithHolderName("worker-1"), func(o tokensem.Options) bool { return o.HolderName == "worker-1" }, nil},
		{"holder name 1 byte", tokensem.WithHolderName("w"), func(o tokensem.Options) bool { return o.HolderName == "w" }, nil},
		{"holder name 128 bytes", tokensem.WithHolderName(strings.Repeat("h", 128)), func(o tokensem.Options) bool { return len(o.HolderName) == 128 }, nil},
		{"holder name empty", tokensem.WithHolderName(""), nil, tokensem.ErrInvalidOption},
		{"holder name 129 bytes", tokensem.WithHolderName(strings.Repeat("h", 129)), nil, tokensem.ErrInvalidOption},

		{"request timeout", tokensem.WithRequestTimeout(time.Millisecond), func(o tokensem.Options) bool { return o.RequestTimeout == time.Millisecond }, nil},
		{"request timeout 1ns", tokensem.WithRequestTimeout(time.Nanosecond), func(o tokensem.Options) bool { return o.RequestTimeout == time.Nanosecond }, nil},
		{"request timeout zero", tokensem.WithRequestTimeout(0), nil, tokensem.ErrInvalidOption},
		{"request timeout negative", tokensem.WithRequestTimeout(-time.Second), nil, tokensem.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tokensem.DefaultOptions()
			before := o
			err := tt.opt(&o)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("option error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("option error = %v, want nil", err)
				}
				if !tt.check(o) {
					t.Errorf("option accepted but Options = %+v", o)
				}
				return
			}
			if !sameOptions(o, before) {
				t.Errorf("rejected option changed Options: %+v -> %+v", before, o)
			}
		})
	}
}

func sameOptions(a, b tokensem.Options) bool {
	return a.Lease == b.Lease && bytes.Equal(a.Key, b.Key) && a.Logger == b.Logger &&
		a.HolderName == b.HolderName && a.RequestTimeout == b.RequestTimeout
}

func TestWithKeyCopies(t *testing.T) {
	key := []byte("0123456789abcdef")
	want := bytes.Clone(key)
	opt := tokensem.WithKey(key)
	var o tokensem.Options
	if err := opt(&o); err != nil {
		t.Fatal(err)
	}
	key[0] = 'X' // after applying
	if !bytes.Equal(o.Key, want) {
		t.Errorf("Options.Key = %q after the caller mutated its slice, want %q", o.Key, want)
	}
	if &o.Key[0] == &key[0] {
		t.Error("Options.Key aliases the caller's slice")
	}

	// Applying the same option twice must not share storage either.
	var o2 tokensem.Options
	if err := opt(&o2); err != nil {
		t.Fatal(err)
	}
	o2.Key[1] = 'Y'
	if !bytes.Equal(o.Key, want) {
		t.Errorf("two applications of one WithKey share storage: Options.Key = %q", o.Key)
	}
}
