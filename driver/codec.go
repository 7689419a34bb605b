package driver

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/ids"
)

// NewToken returns a token for slot index of epoch with a fresh random ID.
func NewToken(semaphore string, index int, epoch uint64) tokensem.Token {
	return tokensem.Token{Semaphore: semaphore, Index: index, Epoch: epoch, ID: ids.New()}
}

// Token wire format, version 1:
//
//	t1.<semaphore>.<index>.<epoch>.<id>.<signature>
//
// index and epoch are decimal, id is 32 lowercase hex digits, and signature is
// the unpadded base64url HMAC-SHA256 of everything before it (including the
// final '.') under the shared key, or empty when the codec has no key.
// Semaphore names cannot contain '.', so the fields are unambiguous.
const (
	tokenPrefix = "t1."
	// MaxTokenLen bounds an encoded token; longer input is junk.
	MaxTokenLen = 256
	keyCheckMsg = "tokensem key check v1"
)

// A Codec encodes and decodes tokens, signing and verifying them when it has
// a key. The zero Codec neither signs nor verifies. A Codec is immutable and
// safe for concurrent use.
type Codec struct {
	key []byte
}

// NewCodec returns a codec that signs with key and, on decode, rejects
// tokens whose signature is missing or does not verify. A nil or empty key
// returns the zero Codec.
func NewCodec(key []byte) Codec {
	if len(key) == 0 {
		return Codec{}
	}
	return Codec{key: bytes.Clone(key)}
}

// Signed reports whether the codec has a signing key.
func (c Codec) Signed() bool { return len(c.key) > 0 }

// KeyCheck returns a short fingerprint of the key (empty without one). It is
// stored with a semaphore's configuration so that a client with a different
// key is refused at Open instead of discarding every token as forged.
func (c Codec) KeyCheck() string {
	if !c.Signed() {
		return ""
	}
	return hex.EncodeToString(c.mac([]byte(keyCheckMsg))[:8])
}

// CheckKey returns nil if this codec's key is the one semaphore name was
// created with (stored is the KeyCheck recorded then), and an error
// wrapping tokensem.ErrKeyMismatch that says which way they differ otherwise.
func (c Codec) CheckKey(name, stored string) error {
	switch got := c.KeyCheck(); {
	case got == stored:
		return nil
	case stored == "":
		return fmt.Errorf("%w: %s is unsigned but a key was given", tokensem.ErrKeyMismatch, name)
	case got == "":
		return fmt.Errorf("%w: %s has signed tokens; a key is required", tokensem.ErrKeyMismatch, name)
	default:
		return fmt.Errorf("%w: %s was created with another key", tokensem.ErrKeyMismatch, name)
	}
}

func (c Codec) mac(b []byte) []byte {
	m := hmac.New(sha256.New, c.key)
	m.Write(b)
	return m.Sum(nil)
}

// Encode returns the wire form of t, signed when the codec has a key. It
// fails (wrapping tokensem.ErrInvalidToken) when t itself is not well formed.
func (c Codec) Encode(t tokensem.Token) ([]byte, error) {
	if err := validate(t); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 128)
	b = append(b, tokenPrefix...)
	b = append(b, t.Semaphore...)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(t.Index), 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, t.Epoch, 10)
	b = append(b, '.')
	b = append(b, t.ID...)
	b = append(b, '.')
	if c.Signed() {
		b = base64.RawURLEncoding.AppendEncode(b, c.mac(b))
	}
	return b, nil
}

// Decode parses a token. Malformed input returns an error wrapping
// tokensem.ErrInvalidToken. With a key, a missing or wrong signature returns an
// error wrapping tokensem.ErrForgedToken. Without a key, signatures are not checked.
func (c Codec) Decode(b []byte) (tokensem.Token, error) {
	if len(b) > MaxTokenLen {
		return tokensem.Token{}, fmt.Errorf("%w: %d bytes (max %d)", tokensem.ErrInvalidToken, len(b), MaxTokenLen)
	}
	if !bytes.HasPrefix(b, []byte(tokenPrefix)) {
		return tokensem.Token{}, fmt.Errorf("%w: unknown format %q", tokensem.ErrInvalidToken, clip(b))
	}
	f := bytes.Split(b[len(tokenPrefix):], []byte{'.'})
	if len(f) != 5 {
		return tokensem.Token{}, fmt.Errorf("%w: %d fields, want 5: %q", tokensem.ErrInvalidToken, len(f), clip(b))
	}
	idx, err := strconv.ParseUint(string(f[1]), 10, 31)
	if err != nil {
		return tokensem.Token{}, fmt.Errorf("%w: index %q", tokensem.ErrInvalidToken, f[1])
	}
	epoch, err := strconv.ParseUint(string(f[2]), 10, 64)
	if err != nil {
		return tokensem.Token{}, fmt.Errorf("%w: epoch %q", tokensem.ErrInvalidToken, f[2])
	}
	t := tokensem.Token{Semaphore: string(f[0]), Index: int(idx), Epoch: epoch, ID: string(f[3])}
	if err := validate(t); err != nil {
		return tokensem.Token{}, err
	}
	// One token has exactly one spelling: the fields must be as Encode
	// writes them (no leading zeros), and so must the signature (compared
	// as text, so base64 variants with line breaks or stray low bits fail).
	sig := f[4]
	body := b[:len(b)-len(sig)]
	want, _ := Codec{}.Encode(t)
	if !bytes.Equal(body, want) {
		return tokensem.Token{}, fmt.Errorf("%w: non-canonical encoding %q", tokensem.ErrInvalidToken, clip(b))
	}
	if c.Signed() {
		if len(sig) == 0 {
			return tokensem.Token{}, fmt.Errorf("%w: %s is unsigned", tokensem.ErrForgedToken, t)
		}
		if !hmac.Equal(sig, base64.RawURLEncoding.AppendEncode(nil, c.mac(body))) {
			return tokensem.Token{}, fmt.Errorf("%w: %s has a bad signature", tokensem.ErrForgedToken, t)
		}
	}
	return t, nil
}

func validate(t tokensem.Token) error {
	if err := tokensem.ValidateName(strings.TrimPrefix(t.Semaphore, gatePrefix)); err != nil {
		return fmt.Errorf("%w: %w", tokensem.ErrInvalidToken, err)
	}
	if t.Index < 0 || t.Index >= tokensem.MaxPermits {
		return fmt.Errorf("%w: index %d out of range", tokensem.ErrInvalidToken, t.Index)
	}
	if len(t.ID) != 32 {
		return fmt.Errorf("%w: id %q is not 32 hex digits", tokensem.ErrInvalidToken, t.ID)
	}
	for i := 0; i < len(t.ID); i++ {
		if c := t.ID[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%w: id %q is not 32 hex digits", tokensem.ErrInvalidToken, t.ID)
		}
	}
	return nil
}

func clip(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}
