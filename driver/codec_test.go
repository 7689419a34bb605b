package driver_test

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

const testID = "0123456789abcdef0123456789abcdef"

var (
	testKey  = []byte("0123456789abcdef-first-key")
	otherKey = []byte("0123456789abcdef-other-key")
)

// sigLen is the length of an unpadded base64url HMAC-SHA256.
const sigLen = 43

func testToken() tokensem.Token {
	return tokensem.Token{Semaphore: "orders", Index: 3, Epoch: 7, ID: testID}
}

func mustEncode(t testing.TB, c driver.Codec, tok tokensem.Token) []byte {
	t.Helper()
	b, err := c.Encode(tok)
	if err != nil {
		t.Fatalf("Encode(%+v): %v", tok, err)
	}
	return b
}

// withField returns enc with its i-th dot-separated field replaced by v
// (field 0 is the "t1" prefix), keeping every other byte, including the
// signature.
func withField(t testing.TB, enc []byte, i int, v string) []byte {
	t.Helper()
	f := strings.Split(string(enc), ".")
	if len(f) != 6 {
		t.Fatalf("token %q has %d fields, want 6", enc, len(f))
	}
	f[i] = v
	return []byte(strings.Join(f, "."))
}

func TestCodecRoundTrip(t *testing.T) {
	codecs := []struct {
		name  string
		codec driver.Codec
	}{
		{"unsigned", driver.NewCodec(nil)},
		{"zero", driver.Codec{}},
		{"signed", driver.NewCodec(testKey)},
	}
	tokens := []struct {
		name string
		tok  tokensem.Token
	}{
		{"typical", testToken()},
		{"zero index and epoch", tokensem.Token{Semaphore: "a", Index: 0, Epoch: 0, ID: testID}},
		{"last index", tokensem.Token{Semaphore: "A_b-9", Index: tokensem.MaxPermits - 1, Epoch: 1, ID: testID}},
		{"max epoch", tokensem.Token{Semaphore: "tenant-42", Index: 1, Epoch: math.MaxUint64, ID: testID}},
		{"longest name", tokensem.Token{Semaphore: strings.Repeat("n", tokensem.MaxNameLen), Index: tokensem.MaxPermits - 1, Epoch: math.MaxUint64, ID: testID}},
		{"fresh", driver.NewToken("orders", 5, 9)},
	}
	for _, c := range codecs {
		for _, tt := range tokens {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				enc := mustEncode(t, c.codec, tt.tok)
				if len(enc) > driver.MaxTokenLen {
					t.Errorf("encoded length %d > MaxTokenLen %d", len(enc), driver.MaxTokenLen)
				}
				want := "t1." + tt.tok.Semaphore + "." + strconv.Itoa(tt.tok.Index) + "." +
					strconv.FormatUint(tt.tok.Epoch, 10) + "." + tt.tok.ID + "."
				if !bytes.HasPrefix(enc, []byte(want)) {
					t.Fatalf("Encode = %q, want prefix %q", enc, want)
				}
				sig := enc[len(want):]
				if c.codec.Signed() {
					if len(sig) != sigLen {
						t.Errorf("signature %q has %d bytes, want %d", sig, len(sig), sigLen)
					}
				} else if len(sig) != 0 {
					t.Errorf("unsigned codec wrote signature %q", sig)
				}
				got, err := c.codec.Decode(enc)
				if err != nil {
					t.Fatalf("Decode(%q): %v", enc, err)
				}
				if got != tt.tok {
					t.Errorf("Decode(Encode(%+v)) = %+v", tt.tok, got)
				}
			})
		}
	}
}

func TestEncodeRejectsMalformedToken(t *testing.T) {
	tests := []struct {
		name    string
		tok     tokensem.Token
		wantErr error
	}{
		{"empty name", tokensem.Token{Semaphore: "", ID: testID}, tokensem.ErrInvalidName},
		{"dotted name", tokensem.Token{Semaphore: "a.b", ID: testID}, tokensem.ErrInvalidName},
		{"negative index", tokensem.Token{Semaphore: "a", Index: -1, ID: testID}, tokensem.ErrInvalidToken},
		{"index MaxPermits", tokensem.Token{Semaphore: "a", Index: tokensem.MaxPermits, ID: testID}, tokensem.ErrInvalidToken},
		{"empty id", tokensem.Token{Semaphore: "a"}, tokensem.ErrInvalidToken},
		{"short id", tokensem.Token{Semaphore: "a", ID: testID[1:]}, tokensem.ErrInvalidToken},
		{"uppercase id", tokensem.Token{Semaphore: "a", ID: strings.ToUpper(testID)}, tokensem.ErrInvalidToken},
		{"dot in id", tokensem.Token{Semaphore: "a", ID: testID[:31] + "."}, tokensem.ErrInvalidToken},
	}
	codecs := []struct {
		name  string
		codec driver.Codec
	}{
		{"unsigned", driver.Codec{}},
		{"signed", driver.NewCodec(testKey)},
	}
	for _, c := range codecs {
		for _, tt := range tests {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				b, err := c.codec.Encode(tt.tok)
				if !errors.Is(err, tt.wantErr) || !errors.Is(err, tokensem.ErrInvalidToken) {
					t.Fatalf("Encode(%+v) = %q, %v; want error wrapping %v and ErrInvalidToken", tt.tok, b, err, tt.wantErr)
				}
				if b != nil {
					t.Errorf("Encode returned bytes %q with an error", b)
				}
			})
		}
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	valid := string(mustEncode(t, driver.Codec{}, testToken())) // "t1.orders.3.7.<id>."
	field := func(i int, v string) string { return string(withField(t, []byte(valid), i, v)) }
	tooLong := valid + strings.Repeat("A", driver.MaxTokenLen+1-len(valid))

	tests := []struct {
		name    string
		in      string
		wantErr error
	}{
		{"empty", "", tokensem.ErrInvalidToken},
		{"prefix only", "t1.", tokensem.ErrInvalidToken},
		{"no prefix", strings.TrimPrefix(valid, "t1."), tokensem.ErrInvalidToken},
		{"version 2", "t2." + strings.TrimPrefix(valid, "t1."), tokensem.ErrInvalidToken},
		{"uppercase prefix", "T1." + strings.TrimPrefix(valid, "t1."), tokensem.ErrInvalidToken},
		{"leading space", " " + valid, tokensem.ErrInvalidToken},
		{"too long", tooLong, tokensem.ErrInvalidToken},
		{"4 fields", strings.TrimSuffix(valid, "."), tokensem.ErrInvalidToken},
		{"6 fields", valid + "sig.extra", tokensem.ErrInvalidToken},
		{"trailing newline", valid + "sig.\n", tokensem.ErrInvalidToken},
		{"empty index", field(2, ""), tokensem.ErrInvalidToken},
		{"alpha index", field(2, "x"), tokensem.ErrInvalidToken},
		{"hex index", field(2, "0x1"), tokensem.ErrInvalidToken},
		{"negative index", field(2, "-1"), tokensem.ErrInvalidToken},
		{"plus index", field(2, "+1"), tokensem.ErrInvalidToken},
		{"underscored index", field(2, "1_0"), tokensem.ErrInvalidToken},
		{"spaced index", field(2, " 1"), tokensem.ErrInvalidToken},
		{"index MaxPermits", field(2, strconv.Itoa(tokensem.MaxPermits)), tokensem.ErrInvalidToken},
		{"index 2^31", field(2, "2147483648"), tokensem.ErrInvalidToken},
		{"index 2^64", field(2, "18446744073709551616"), tokensem.ErrInvalidToken},
		{"empty epoch", field(3, ""), tokensem.ErrInvalidToken},
		{"alpha epoch", field(3, "x"), tokensem.ErrInvalidToken},
		{"negative epoch", field(3, "-1"), tokensem.ErrInvalidToken},
		{"float epoch", field(3, "1e3"), tokensem.ErrInvalidToken},
		{"epoch 2^64", field(3, "18446744073709551616"), tokensem.ErrInvalidToken},
		{"empty id", field(4, ""), tokensem.ErrInvalidToken},
		{"id 31 digits", field(4, testID[:31]), tokensem.ErrInvalidToken},
		{"id 33 digits", field(4, testID+"0"), tokensem.ErrInvalidToken},
		{"uppercase id", field(4, strings.ToUpper(testID)), tokensem.ErrInvalidToken},
		{"non-hex id", field(4, testID[:31]+"g"), tokensem.ErrInvalidToken},
		{"empty name", field(1, ""), tokensem.ErrInvalidName},
		{"name with leading dash", field(1, "-a"), tokensem.ErrInvalidName},
		{"name with space", field(1, "a b"), tokensem.ErrInvalidName},
		{"name with star", field(1, "a*"), tokensem.ErrInvalidName},
		{"non-ASCII name", field(1, "ä"), tokensem.ErrInvalidName},
		{"65-byte name", field(1, strings.Repeat("a", tokensem.MaxNameLen+1)), tokensem.ErrInvalidName},
	}
	codecs := []struct {
		name  string
		codec driver.Codec
	}{
		{"unsigned", driver.Codec{}},
		{"signed", driver.NewCodec(testKey)},
	}
	for _, c := range codecs {
		for _, tt := range tests {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				got, err := c.codec.Decode([]byte(tt.in))
				if !errors.Is(err, tt.wantErr) || !errors.Is(err, tokensem.ErrInvalidToken) {
					t.Fatalf("Decode(%q) = %+v, %v; want error wrapping %v and ErrInvalidToken", tt.in, got, err, tt.wantErr)
				}
				if got != (tokensem.Token{}) {
					t.Errorf("Decode returned %+v with an error", got)
				}
			})
		}
	}
}

func TestDecodeLengthBoundary(t *testing.T) {
	// Without a key the signature field is not checked, so padding it
	// isolates the length limit.
	valid := string(mustEncode(t, driver.Codec{}, testToken()))
	atMax := valid + strings.Repeat("A", driver.MaxTokenLen-len(valid))
	got, err := driver.Codec{}.Decode([]byte(atMax))
	if err != nil {
		t.Fatalf("Decode of a %d-byte token: %v", len(atMax), err)
	}
	if got != testToken() {
		t.Errorf("Decode = %+v, want %+v", got, testToken())
	}
	_, err = driver.Codec{}.Decode([]byte(atMax + "A"))
	if !errors.Is(err, tokensem.ErrInvalidToken) {
		t.Errorf("Decode of a %d-byte token: %v, want ErrInvalidToken", len(atMax)+1, err)
	}
}

func TestDecodeForged(t *testing.T) {
	c := driver.NewCodec(testKey)
	signed := mustEncode(t, c, testToken())
	unsigned := mustEncode(t, driver.Codec{}, testToken())
	otherSigned := mustEncode(t, driver.NewCodec(otherKey), testToken())
	sig := string(signed[bytes.LastIndexByte(signed, '.')+1:])
	sibling := testToken()
	sibling.Index++
	siblingSigned := mustEncode(t, c, sibling)
	siblingSig := string(siblingSigned[bytes.LastIndexByte(siblingSigned, '.')+1:])

	tests := []struct {
		name    string
		in      []byte
		wantErr error
	}{
		{"unsigned", unsigned, tokensem.ErrForgedToken},
		{"other key", otherSigned, tokensem.ErrForgedToken},
		{"tampered name", withField(t, signed, 1, "orderz"), tokensem.ErrForgedToken},
		{"tampered index", withField(t, signed, 2, "4"), tokensem.ErrForgedToken},
		{"index with leading zero", withField(t, signed, 2, "03"), tokensem.ErrInvalidToken},
		{"tampered epoch", withField(t, signed, 3, "8"), tokensem.ErrForgedToken},
		{"tampered id", withField(t, signed, 4, "f"+testID[1:]), tokensem.ErrForgedToken},
		{"sibling's signature", withField(t, signed, 5, siblingSig), tokensem.ErrForgedToken},
		{"truncated signature", signed[:len(signed)-1], tokensem.ErrForgedToken},
		{"half signature", withField(t, signed, 5, sig[:len(sig)/2]), tokensem.ErrForgedToken},
		{"signature one byte", withField(t, signed, 5, sig[:1]), tokensem.ErrForgedToken},
		{"signature extended", append(bytes.Clone(signed), 'A'), tokensem.ErrForgedToken},
		{"line break in signature", withField(t, signed, 5, sig[:10]+"\r\n"+sig[10:]), tokensem.ErrForgedToken},
		{"padded signature", append(bytes.Clone(signed), '='), tokensem.ErrForgedToken},
		{"std base64 alphabet", withField(t, signed, 5, strings.Repeat("+", sigLen)), tokensem.ErrForgedToken},
		{"junk signature", withField(t, signed, 5, "!!!"), tokensem.ErrForgedToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Decode(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Decode(%q) = %+v, %v; want %v", tt.in, got, err, tt.wantErr)
			}
			if tt.wantErr == tokensem.ErrForgedToken && errors.Is(err, tokensem.ErrInvalidToken) {
				t.Errorf("forged token error %v also wraps ErrInvalidToken", err)
			}
			if got != (tokensem.Token{}) {
				t.Errorf("Decode returned %+v with an error", got)
			}
		})
	}
}

func TestDecodeWithoutKeyIgnoresSignature(t *testing.T) {
	signed := mustEncode(t, driver.NewCodec(testKey), testToken())
	tests := []struct {
		name string
		in   []byte
	}{
		{"signed", signed},
		{"signed by other key", mustEncode(t, driver.NewCodec(otherKey), testToken())},
		{"junk signature", withField(t, signed, 5, "!!!")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := driver.Codec{}.Decode(tt.in)
			if err != nil {
				t.Fatalf("Decode(%q): %v", tt.in, err)
			}
			if got != testToken() {
				t.Errorf("Decode = %+v, want %+v", got, testToken())
			}
		})
	}
}

func TestKeyCheck(t *testing.T) {
	for _, c := range []struct {
		name  string
		codec driver.Codec
	}{
		{"zero", driver.Codec{}},
		{"nil key", driver.NewCodec(nil)},
		{"empty key", driver.NewCodec([]byte{})},
	} {
		if c.codec.Signed() {
			t.Errorf("%s codec: Signed() = true", c.name)
		}
		if kc := c.codec.KeyCheck(); kc != "" {
			t.Errorf("%s codec: KeyCheck() = %q, want empty", c.name, kc)
		}
	}

	a := driver.NewCodec(testKey)
	if !a.Signed() {
		t.Fatal("NewCodec(key).Signed() = false")
	}
	kc := a.KeyCheck()
	if len(kc) != 16 || strings.Trim(kc, "0123456789abcdef") != "" {
		t.Errorf("KeyCheck() = %q, want 16 lowercase hex digits", kc)
	}
	if again := driver.NewCodec(bytes.Clone(testKey)).KeyCheck(); again != kc {
		t.Errorf("KeyCheck differs for the same key: %q vs %q", kc, again)
	}
	if other := driver.NewCodec(otherKey).KeyCheck(); other == kc {
		t.Errorf("KeyCheck is %q for two different keys", kc)
	}
}

func TestNewCodecCopiesKey(t *testing.T) {
	key := bytes.Clone(testKey)
	c := driver.NewCodec(key)
	kc := c.KeyCheck()
	enc := mustEncode(t, c, testToken())
	for i := range key {
		key[i] = 0
	}
	if got := c.KeyCheck(); got != kc {
		t.Errorf("KeyCheck changed after mutating the caller's key: %q -> %q", kc, got)
	}
	if _, err := c.Decode(enc); err != nil {
		t.Errorf("Decode after mutating the caller's key: %v", err)
	}
}

func TestNewToken(t *testing.T) {
	const n = 1000
	seen := make(map[string]bool, n)
	for i := range n {
		tok := driver.NewToken("orders", i, 42)
		if tok.Semaphore != "orders" || tok.Index != i || tok.Epoch != 42 {
			t.Fatalf("NewToken(orders, %d, 42) = %+v", i, tok)
		}
		if len(tok.ID) != 32 || strings.Trim(tok.ID, "0123456789abcdef") != "" {
			t.Fatalf("ID %q is not 32 lowercase hex digits", tok.ID)
		}
		if seen[tok.ID] {
			t.Fatalf("ID %q issued twice", tok.ID)
		}
		seen[tok.ID] = true
	}
}

func TestTokenString(t *testing.T) {
	tests := []struct {
		name string
		tok  tokensem.Token
		want string
	}{
		{"typical", testToken(), "orders[3]@7"},
		{"zero", tokensem.Token{Semaphore: "a"}, "a[0]@0"},
		{"max epoch", tokensem.Token{Semaphore: "tenant-42", Index: tokensem.MaxPermits - 1, Epoch: math.MaxUint64, ID: testID}, "tenant-42[1048575]@18446744073709551615"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.tok.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzDecode checks that Decode never panics, that it fails only with the
// documented sentinels, and that whatever it accepts is canonical: a keyed
// codec accepts exactly the bytes Encode writes, and an unkeyed one accepts
// exactly Encode's fields followed by any signature field it cannot check.
func FuzzDecode(f *testing.F) {
	signedCodec := driver.NewCodec(testKey)
	seeds := []tokensem.Token{
		testToken(),
		{Semaphore: "a", Index: 0, Epoch: 0, ID: testID},
		{Semaphore: strings.Repeat("n", tokensem.MaxNameLen), Index: tokensem.MaxPermits - 1, Epoch: math.MaxUint64, ID: testID},
	}
	for _, tok := range seeds {
		f.Add(mustEncode(f, driver.Codec{}, tok))
		f.Add(mustEncode(f, signedCodec, tok))
		f.Add(mustEncode(f, driver.NewCodec(otherKey), tok))
	}
	f.Add([]byte(""))
	f.Add([]byte("t1."))
	f.Add([]byte("t1....."))
	f.Add([]byte("t1.orders.007.0007." + testID + "."))
	f.Add(append(mustEncode(f, signedCodec, testToken()), '\n'))
	f.Add([]byte("t1.orders.3.7." + testID + ".junk"))
	f.Add([]byte("t2.orders.3.7." + testID + "."))
	f.Add([]byte("\x00\xff.t1"))

	codecs := []driver.Codec{{}, signedCodec}
	f.Fuzz(func(t *testing.T, in []byte) {
		orig := bytes.Clone(in)
		for _, c := range codecs {
			tok, err := c.Decode(in)
			if !bytes.Equal(in, orig) {
				t.Fatalf("Decode modified its input: %q -> %q", orig, in)
			}
			if err != nil {
				if !errors.Is(err, tokensem.ErrInvalidToken) && !errors.Is(err, tokensem.ErrForgedToken) {
					t.Fatalf("Decode(%q) (signed %v): unexpected error %v", in, c.Signed(), err)
				}
				if !c.Signed() && errors.Is(err, tokensem.ErrForgedToken) {
					t.Fatalf("unsigned Decode(%q) reported a forgery: %v", in, err)
				}
				if tok != (tokensem.Token{}) {
					t.Fatalf("Decode(%q) returned %+v with error %v", in, tok, err)
				}
				continue
			}
			re, err := c.Encode(tok)
			if err != nil {
				t.Fatalf("Decode(%q) accepted %+v, which Encode rejects: %v", in, tok, err)
			}
			back, err := c.Decode(re)
			if err != nil || back != tok {
				t.Fatalf("Decode(%q) = %+v; re-encoded %q decodes to %+v, %v", in, tok, re, back, err)
			}
			if again, _ := c.Encode(back); !bytes.Equal(again, re) {
				t.Fatalf("Encode is not stable: %q then %q", re, again)
			}
			if c.Signed() && !bytes.Equal(re, in) {
				t.Fatalf("signed Decode accepted %q, but Encode writes %q", in, re)
			}
			if body := in[:bytes.LastIndexByte(in, '.')+1]; !c.Signed() && !bytes.Equal(re, body) {
				t.Fatalf("unsigned Decode accepted fields %q, but Encode writes %q", body, re)
			}
		}
	})
}

func TestCheckKey(t *testing.T) {
	signed := driver.NewCodec([]byte("a key of sixteen bytes"))
	other := driver.NewCodec([]byte("another key, 16+ bytes"))
	unsigned := driver.NewCodec(nil)
	tests := []struct {
		name   string
		codec  driver.Codec
		stored string
		ok     bool
	}{
		{"same key", signed, signed.KeyCheck(), true},
		{"both unsigned", unsigned, "", true},
		{"key given, semaphore unsigned", signed, "", false},
		{"no key, semaphore signed", unsigned, signed.KeyCheck(), false},
		{"another key", other, signed.KeyCheck(), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.codec.CheckKey("s", tc.stored)
			if tc.ok != (err == nil) || err != nil && !errors.Is(err, tokensem.ErrKeyMismatch) {
				t.Fatalf("CheckKey = %v, want ok %v (else ErrKeyMismatch)", err, tc.ok)
			}
		})
	}
}
