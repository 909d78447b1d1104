package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw     string
		max     int
		want    string
		wantErr error
		reason  string // in the error, for the ambiguous forms
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
		{raw: `"abc";x=1`, wantErr: idem.ErrKeyInvalid, reason: "parameters"},
		// A quoted key may hold what is ambiguous outside the quotes.
		{raw: `"a,b"`, want: "a,b"},
		{raw: `"a;x=1"`, want: "a;x=1"},
		{raw: `"(a)"`, want: "(a)"},
		{raw: `" a,b "`, wantErr: idem.ErrKeyInvalid}, // the spaces inside the quotes are not visible ASCII
		{raw: "a(b)", want: "a(b)"},                   // a parenthesis after the first character is no Inner List
		// Ambiguous values: lists (what several field lines combine
		// into), Inner Lists, parameters, bare , ; and (.
		{raw: "k1, k2", wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: `"k1", "k2"`, wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: `"k1","k2"`, wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: `"k1" ,"k2"`, wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: `"k1", k2`, wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: `"k1",`, wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: "a,b", wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: "a,", wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: ",a", wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: ",", wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: ", ", wantErr: idem.ErrKeyInvalid, reason: "list"},
		{raw: `("a" "b")`, wantErr: idem.ErrKeyInvalid, reason: "Inner List"},
		{raw: `("a")`, wantErr: idem.ErrKeyInvalid, reason: "Inner List"},
		{raw: "(a)", wantErr: idem.ErrKeyInvalid, reason: "Inner List"},
		{raw: "(", wantErr: idem.ErrKeyInvalid, reason: "Inner List"},
		{raw: `"a";x=1`, wantErr: idem.ErrKeyInvalid, reason: "parameters"},
		{raw: `"a" ;x`, wantErr: idem.ErrKeyInvalid, reason: "parameters"},
		{raw: "a;x", wantErr: idem.ErrKeyInvalid, reason: "parameters"},
		{raw: "a;x=1", wantErr: idem.ErrKeyInvalid, reason: "parameters"},
		{raw: "a;", wantErr: idem.ErrKeyInvalid, reason: "parameters"},
		{raw: ";", wantErr: idem.ErrKeyInvalid, reason: "parameters"},
	}
	for _, tc := range tests {
		got, err := idem.ParseKey(tc.raw, tc.max)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("ParseKey(%q) = %q, %v; want error %v", tc.raw, got, err, tc.wantErr)
			} else if !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("ParseKey(%q): %v; want the reason %q", tc.raw, err, tc.reason)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
		}
	}
}

// TestKeyField: the field lines an adapter hands over become one value,
// which ParseKey reads as the request's key, refuses, or reads as missing.
func TestKeyField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		lines   []string
		want    string
		key     string // ParseKey's key, when it accepts the value
		wantErr error
	}{
		{lines: nil, want: "", wantErr: idem.ErrKeyMissing},
		{lines: []string{}, want: "", wantErr: idem.ErrKeyMissing},
		{lines: []string{"k1"}, want: "k1", key: "k1"},
		{lines: []string{`"a,b"`}, want: `"a,b"`, key: "a,b"},
		{lines: []string{""}, want: " ", wantErr: idem.ErrKeyInvalid},
		{lines: []string{"k1", "k2"}, want: "k1, k2", wantErr: idem.ErrKeyInvalid},
		{lines: []string{"k1", "k1"}, want: "k1, k1", wantErr: idem.ErrKeyInvalid},
		{lines: []string{`"k1"`, `"k2"`}, want: `"k1", "k2"`, wantErr: idem.ErrKeyInvalid},
		{lines: []string{"k1", ""}, want: "k1, ", wantErr: idem.ErrKeyInvalid},
		{lines: []string{"", "k1"}, want: ", k1", wantErr: idem.ErrKeyInvalid},
		{lines: []string{"", ""}, want: ", ", wantErr: idem.ErrKeyInvalid},
		{lines: []string{"a", "b", "c"}, want: "a, b, c", wantErr: idem.ErrKeyInvalid},
	}
	for _, tc := range tests {
		got := idemadapter.KeyField(tc.lines)
		if got != tc.want {
			t.Errorf("KeyField(%q) = %q, want %q", tc.lines, got, tc.want)
			continue
		}
		key, err := idem.ParseKey(got, 0)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("ParseKey(KeyField(%q)) = %q, %v; want error %v", tc.lines, key, err, tc.wantErr)
			}
			continue
		}
		if err != nil || key != tc.key {
			t.Errorf("ParseKey(KeyField(%q)) = %q, %v; want %q", tc.lines, key, err, tc.key)
		}
	}
}

// FuzzParseKey checks ParseKey never panics, only returns visible-ASCII keys
// within the limit, refuses what httpsfv reads as a list of other than one
// member, an Inner List or parameters, refuses every value of several field
// lines (KeyField), and agrees with httpsfv on every quoted form.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\b"`, `""`, `"`, `"\`, ` "x" `, "a b", `"a b"`,
		strings.Repeat("k", 256), "\x00", "ü", `"abc";p=1`, `"abc" , "def"`,
		"a,b", "a, b", `"a,b"`, `"a;b"`, `("a" "b")`, "(a)", "a;x", `"a";x=1`, "1,2", ":YQ==:, b"} {
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
		if list, lerr := httpsfv.UnmarshalList([]string{trimmed}); lerr == nil && err == nil {
			if len(list) != 1 {
				t.Fatalf("ParseKey accepted %q as %q; httpsfv reads a list of %d members", raw, key, len(list))
			}
			switch m := list[0].(type) {
			case httpsfv.InnerList:
				t.Fatalf("ParseKey accepted %q as %q; httpsfv reads an Inner List", raw, key)
			case httpsfv.Item:
				if len(m.Params.Names()) != 0 {
					t.Fatalf("ParseKey accepted %q as %q; httpsfv reads parameters %v", raw, key, m.Params.Names())
				}
			}
		}
		for _, lines := range [][]string{{raw, raw}, {raw, "k"}, {"k", raw}} {
			if k, err := idem.ParseKey(idemadapter.KeyField(lines), 0); !errors.Is(err, idem.ErrKeyInvalid) {
				t.Fatalf("ParseKey of the field lines %q = %q, %v; want ErrKeyInvalid", lines, k, err)
			}
		}
		if !strings.HasPrefix(trimmed, `"`) {
			if err == nil && (key != trimmed || strings.ContainsAny(key, ",;") || key[0] == '(') {
				t.Fatalf("ParseKey(%q) accepted the bare key %q", raw, key)
			}
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

// TestParseKeyForms: the bare and the quoted form name the same key; an
// unterminated string, a control character and an empty value are refused.
func TestParseKeyForms(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw, key string
		refused  bool
	}{
		{`7f3a`, "7f3a", false},
		{`"7f3a"`, "7f3a", false},
		{`"unterminated`, "", true},
		{"tab\tinside", "", true},
		{"", "", true},
	} {
		key, err := idem.ParseKey(tc.raw, 0)
		if key != tc.key || (err != nil) != tc.refused {
			t.Errorf("ParseKey(%q) = %q, %v; want %q, refused %v", tc.raw, key, err, tc.key, tc.refused)
		}
	}
}
