package tokensem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tokensem/tokensem"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr error
	}{
		{"one letter", "a", nil},
		{"one digit", "7", nil},
		{"word", "orders", nil},
		{"dash and digits", "tenant-42", nil},
		{"mixed case underscore dash", "A_b-9", nil},
		{"trailing dash", "a-", nil},
		{"64 bytes", strings.Repeat("x", tokensem.MaxNameLen), nil},
		{"empty", "", tokensem.ErrInvalidName},
		{"65 bytes", strings.Repeat("x", tokensem.MaxNameLen+1), tokensem.ErrInvalidName},
		{"leading dash", "-a", tokensem.ErrInvalidName},
		{"leading underscore", "_a", tokensem.ErrInvalidName},
		{"dot", "a.b", tokensem.ErrInvalidName},
		{"amq prefix", "amq.x", tokensem.ErrInvalidName},
		{"space", "a b", tokensem.ErrInvalidName},
		{"star", "a*", tokensem.ErrInvalidName},
		{"greater-than", "a>", tokensem.ErrInvalidName},
		{"non-ASCII", "ä", tokensem.ErrInvalidName},
		{"slash", "a/b", tokensem.ErrInvalidName},
		{"NUL", "a\x00", tokensem.ErrInvalidName},
		{"newline", "a\n", tokensem.ErrInvalidName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tokensem.ValidateName(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ValidateName(%q) = %v, want %v", tt.in, err, tt.wantErr)
			}
			if tt.wantErr == nil && err != nil {
				t.Fatalf("ValidateName(%q) = %v, want nil", tt.in, err)
			}
		})
	}
}

// The messages say what is wrong in the user's terms: a very long name
// shortened, a non-ASCII character shown as itself, not as a byte.
func TestValidateNameMessages(t *testing.T) {
	for in, want := range map[string]string{
		strings.Repeat("y", 300): `"yyyyyyyyyyyyyyyyyyyyyyyy…yyyyyyyy" is 300 bytes, longer than 64`,
		"héllo":                  `character 'é' at byte 1 is not an ASCII letter`,
		"-x":                     `starts with '-'`,
	} {
		err := tokensem.ValidateName(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateName(%.20q) = %v, want it to say %s", in, err, want)
		}
	}
}

func TestValidatePermits(t *testing.T) {
	tests := []struct {
		name    string
		in      int
		wantErr error
	}{
		{"one", 1, nil},
		{"typical", 10, nil},
		{"MaxPermits", tokensem.MaxPermits, nil},
		{"zero", 0, tokensem.ErrInvalidPermits},
		{"negative", -1, tokensem.ErrInvalidPermits},
		{"MaxPermits+1", tokensem.MaxPermits + 1, tokensem.ErrInvalidPermits},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tokensem.ValidatePermits(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ValidatePermits(%d) = %v, want %v", tt.in, err, tt.wantErr)
			}
			if tt.wantErr == nil && err != nil {
				t.Fatalf("ValidatePermits(%d) = %v, want nil", tt.in, err)
			}
		})
	}
}
