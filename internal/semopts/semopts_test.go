package semopts_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semopts"
)

func TestDefaults(t *testing.T) {
	o := semopts.Defaults()
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
	name := semopts.DefaultHolderName()
	if name == "" || !strings.Contains(name, ":") {
		t.Errorf("DefaultHolderName = %q, want host:pid", name)
	}
	// The defaults must themselves pass the checks.
	if err := semopts.CheckHolderName(name); err != nil {
		t.Errorf("the default holder name is rejected: %v", err)
	}
	if err := semopts.CheckLease(tokensem.DefaultLease); err != nil {
		t.Errorf("the default lease is rejected: %v", err)
	}
	for _, opt := range []semopts.Option{semopts.WithLogger(o.Logger), semopts.WithRequestTimeout(o.RequestTimeout)} {
		if err := opt(&o); err != nil {
			t.Errorf("a default is rejected by its own option: %v", err)
		}
	}
}

func TestChecks(t *testing.T) {
	tests := []struct {
		name string
		err  error
		ok   bool
	}{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.ok != (tt.err == nil) || tt.err != nil && !errors.Is(tt.err, tokensem.ErrInvalidOption) {
				t.Fatalf("check = %v, want ok %v (else ErrInvalidOption)", tt.err, tt.ok)
			}
		})
	}
}

func TestOptions(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	key16 := bytes.Repeat([]byte{'k'}, 16)
	tests := []struct {
		name    string
		opt     semopts.Option
		check   func(semopts.Options) bool // for accepted options
		wantErr error
	}{

		{"key 16 bytes", semopts.WithKey(key16), func(o semopts.Options) bool { return bytes.Equal(o.Key, key16) }, nil},
		{"key 64 bytes", semopts.WithKey(bytes.Repeat([]byte{1}, 64)), func(o semopts.Options) bool { return len(o.Key) == 64 }, nil},
		{"key 15 bytes", semopts.WithKey(key16[:15]), nil, tokensem.ErrInvalidOption},
		{"key empty", semopts.WithKey([]byte{}), nil, tokensem.ErrInvalidOption},
		{"key nil", semopts.WithKey(nil), nil, tokensem.ErrInvalidOption},

		{"logger", semopts.WithLogger(logger), func(o semopts.Options) bool { return o.Logger == logger }, nil},
		{"logger nil", semopts.WithLogger(nil), nil, tokensem.ErrInvalidOption},

		{"request timeout", semopts.WithRequestTimeout(time.Millisecond), func(o semopts.Options) bool { return o.RequestTimeout == time.Millisecond }, nil},
		{"request timeout 1ns", semopts.WithRequestTimeout(time.Nanosecond), func(o semopts.Options) bool { return o.RequestTimeout == time.Nanosecond }, nil},
		{"request timeout zero", semopts.WithRequestTimeout(0), nil, tokensem.ErrInvalidOption},
		{"request timeout negative", semopts.WithRequestTimeout(-time.Second), nil, tokensem.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := semopts.Defaults()
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

func sameOptions(a, b semopts.Options) bool {
	return bytes.Equal(a.Key, b.Key) && a.Logger == b.Logger && a.RequestTimeout == b.RequestTimeout
}

func TestWithKeyCopies(t *testing.T) {
	key := []byte("0123456789abcdef")
	want := bytes.Clone(key)
	opt := semopts.WithKey(key)
	var o semopts.Options
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
	var o2 semopts.Options
	if err := opt(&o2); err != nil {
		t.Fatal(err)
	}
	o2.Key[1] = 'Y'
	if !bytes.Equal(o.Key, want) {
		t.Errorf("two applications of one WithKey share storage: Options.Key = %q", o.Key)
	}
}

// countObserver counts the events it sees.
type countObserver struct{ n *int }

func (c countObserver) Observe(tokensem.Event) { *c.n++ }

// TestWithObserverAdds: WithObserver given more than once adds observers
// (semmetrics beside an adaptive window); each sees every event, in order.
func TestWithObserverAdds(t *testing.T) {
	var a, b, c int
	o := semopts.Defaults()
	for _, obs := range []tokensem.Observer{countObserver{&a}, countObserver{&b}, countObserver{&c}} {
		if err := semopts.WithObserver(obs)(&o); err != nil {
			t.Fatal(err)
		}
	}
	if err := semopts.WithObserver(nil)(&o); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Errorf("nil observer: %v, want ErrInvalidOption", err)
	}
	o.Observer.Observe(tokensem.Event{Kind: tokensem.EventRelease})
	o.Observer.Observe(tokensem.Event{Kind: tokensem.EventRelease})
	if a != 2 || b != 2 || c != 2 {
		t.Errorf("three observers saw %d, %d and %d of 2 events", a, b, c)
	}
}
