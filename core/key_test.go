package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"

	idem "github.com/idemgo/idem/core"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw     string
		max     int
		want    string
		wantErr error
	}{
		{raw: "abc", want: "abc"},
		{raw: `"abc"`, want: "abc"},
		{raw: "  abc\t", want: "abc"},
		{raw: ` "abc" `, want: "abc"},
		{raw: `"a\"b"`, want: `a"b`},
		{raw: `"a\\b"`, want: `a\b`},
		{raw: "7f3a9c2e-1d4b-4e8f-9a6b-0c1d2e3f4a5b", want: "7f3a9c2e-1d4b-4e8f-9a6b-0c1d2e3f4a5b"},
		{raw: strings.Repeat("k", 255), want: strings.Repeat("k", 255)},
		{raw: "abcd", max: 3, wantErr: idem.ErrKeyInvalid},
		{raw: "", wantErr: idem.ErrKeyMissing},
		{raw: "   ", wantErr: idem.ErrKeyInvalid},
		{raw: "\t", wantErr: idem.ErrKeyInvalid},
		{raw: ` "" `, wantErr: idem.ErrKeyInvalid},
		{raw: `""`, wantErr: idem.ErrKeyInvalid},
		{raw: strings.Repeat("k", 256), wantErr: idem.ErrKeyInvalid},
		{raw: "a b", wantErr: idem.ErrKeyInvalid},
		{raw: `"a b"`, wantErr: idem.ErrKeyInvalid}, // a valid sf-string, but not visible ASCII
		{raw: "ü", wantErr: idem.ErrKeyInvalid},
		{raw: "a\x00b", wantErr: idem.ErrKeyInvalid},
		{raw: "a\x7f", wantErr: idem.ErrKeyInvalid},
		{raw: `"abc`, wantErr: idem.ErrKeyInvalid},
		{raw: `"ab"c"`, wantErr: idem.ErrKeyInvalid},
		{raw: `"a\nb"`, wantErr: idem.ErrKeyInvalid},
		{raw: `"a\`, wantErr: idem.ErrKeyInvalid},
		{raw: `"abc";x=1`, wantErr: idem.ErrKeyInvalid},
	}
	for _, tc := range tests {
		got, err := idem.ParseKey(tc.raw, tc.max)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("ParseKey(%q) = %q, %v; want error %v", tc.raw, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
		}
	}
}

// FuzzParseKey checks ParseKey never panics, only returns visible-ASCII keys
// within the limit, and agrees with httpsfv on every quoted form.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\b"`, `""`, `"`, `"\`, ` "x" `, "a b", `"a b"`,
		strings.Repeat("k", 256), "\x00", "ü", `"abc";p=1`, `"abc" , "def"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		key, err := idem.ParseKey(raw, 0)
		if err == nil {
			if len(key) == 0 || len(key) > idem.DefaultMaxKeyLength {
				t.Fatalf("ParseKey(%q) accepted a key of length %d", raw, len(key))
			}
			for i := 0; i < len(key); i++ {
				if key[i] < 0x21 || key[i] > 0x7e {
					t.Fatalf("ParseKey(%q) accepted byte %#x", raw, key[i])
				}
			}
		} else if !errors.Is(err, idem.ErrKeyInvalid) && !errors.Is(err, idem.ErrKeyMissing) {
			t.Fatalf("ParseKey(%q) error %v wraps neither sentinel", raw, err)
		}
		trimmed := strings.Trim(raw, " \t")
		if !strings.HasPrefix(trimmed, `"`) {
			return
		}
		// Differential check against the RFC 9651 library for quoted forms.
		item, sfErr := httpsfv.UnmarshalItem([]string{trimmed})
		s, isString := item.Value.(string)
		libOK := sfErr == nil && isString && len(item.Params.Names()) == 0
		if libOK {
			visible := s != "" && len(s) <= idem.DefaultMaxKeyLength && !strings.ContainsAny(s, " ")
			if visible && (err != nil || key != s) {
				t.Fatalf("httpsfv reads %q as %q, ParseKey as %q, %v", trimmed, s, key, err)
			}
			if !visible && err == nil {
				t.Fatalf("ParseKey accepted %q (%q), which is not 1-255 visible characters", trimmed, key)
			}
			return
		}
		if err == nil {
			t.Fatalf("ParseKey accepted %q as %q; httpsfv rejects it as an sf-string (%v)", trimmed, key, sfErr)
		}
	})
}
