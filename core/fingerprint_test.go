package idem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/gowebpki/jcs"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
)

func fp(ct, body string, ignore ...string) string {
	return string(idemadapter.Fingerprint(storetest.FingerprintKey, "POST", "/payments", "alice", ct, []byte(body), ignore))
}

const jsonCT = "application/json"

func TestFingerprintEquivalentBodies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ct     string
		a, b   string
		ignore []string
	}{
		{"key order", jsonCT, `{"amount":1,"currency":"EUR"}`, `{"currency":"EUR","amount":1}`, nil},
		{"white space", jsonCT, `{"amount":1}`, "{ \"amount\" :\n 1 }\n", nil},
		{"number spelling", jsonCT, `{"amount":100}`, `{"amount":1e2}`, nil},
		{"trailing zero", jsonCT, `{"amount":1}`, `{"amount":1.0}`, nil},
		{"string escapes", jsonCT, `{"d":"é"}`, `{"d":"\u00e9"}`, nil},
		{"charset parameter", "application/json; charset=utf-8", `{"a":1, "b":2}`, `{"b":2,"a":1}`, nil},
		{"+json suffix", "application/merge-patch+json", `{"a":1, "b":2}`, `{"b":2,"a":1}`, nil},
		{"ignored top-level field", jsonCT, `{"amount":1,"sent_at":"10:00"}`, `{"amount":1,"sent_at":"10:05"}`, []string{"sent_at"}},
		{"ignored field absent", jsonCT, `{"amount":1,"sent_at":"10:00"}`, `{"amount":1}`, []string{"sent_at"}},
		{"ignored nested field", jsonCT, `{"meta":{"sent_at":1,"v":2}}`, `{"meta":{"v":2,"sent_at":3}}`, []string{"meta.sent_at"}},
	}
	for _, tc := range tests {
		if fp(tc.ct, tc.a, tc.ignore...) != fp(tc.ct, tc.b, tc.ignore...) {
			t.Errorf("%s: %s and %s have different fingerprints", tc.name, tc.a, tc.b)
		}
	}
}

func TestFingerprintDistinctRequests(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ct     string
		a, b   string
		ignore []string
	}{
		{"amount", jsonCT, `{"amount":1}`, `{"amount":2}`, nil},
		{"beyond float64 precision", jsonCT, `{"amount":9007199254740993}`, `{"amount":9007199254740992}`, nil},
		{"long decimals", jsonCT, `{"amount":0.10000000000000000001}`, `{"amount":0.1}`, nil},
		{"duplicate members in either order", jsonCT, `{"a":1,"a":2}`, `{"a":2,"a":1}`, nil},
		{"nested ignored name only ignored at its path", jsonCT, `{"x":{"sent_at":1}}`, `{"x":{"sent_at":2}}`, []string{"sent_at"}},
		{"array elements are not ignored", jsonCT, `[{"sent_at":1}]`, `[{"sent_at":2}]`, []string{"sent_at"}},
		{"not JSON: white space counts", "text/plain", `{"a":1}`, `{"a": 1}`, nil},
		{"no content type: bytes count", "", `{"a":1}`, `{"a": 1}`, nil},
		{"JSON and raw never collide", "", `{"a":1}`, `{"a":1}`, nil},
	}
	for _, tc := range tests {
		ctB := tc.ct
		if tc.name == "JSON and raw never collide" {
			ctB = jsonCT
		}
		if string(idemadapter.Fingerprint(storetest.FingerprintKey, "POST", "/p", "u", tc.ct, []byte(tc.a), tc.ignore)) ==
			string(idemadapter.Fingerprint(storetest.FingerprintKey, "POST", "/p", "u", ctB, []byte(tc.b), tc.ignore)) {
			t.Errorf("%s: %s and %s share a fingerprint", tc.name, tc.a, tc.b)
		}
	}
	base := idemadapter.Fingerprint(storetest.FingerprintKey, "POST", "/payments", "alice", jsonCT, []byte(`{}`), nil)
	for name, other := range map[string][]byte{
		"method":    idemadapter.Fingerprint(storetest.FingerprintKey, "PUT", "/payments", "alice", jsonCT, []byte(`{}`), nil),
		"path":      idemadapter.Fingerprint(storetest.FingerprintKey, "POST", "/payments?x=1", "alice", jsonCT, []byte(`{}`), nil),
		"principal": idemadapter.Fingerprint(storetest.FingerprintKey, "POST", "/payments", "bob", jsonCT, []byte(`{}`), nil),
		"boundary":  idemadapter.Fingerprint(storetest.FingerprintKey, "POST", "/paymentsalic", "e", jsonCT, []byte(`{}`), nil),
	} {
		if bytes.Equal(base, other) {
			t.Errorf("changing the %s kept the fingerprint", name)
		}
	}
	if len(base) != idemstore.FingerprintSize {
		t.Fatalf("fingerprint is %d bytes, want %d", len(base), idemstore.FingerprintSize)
	}
}

func TestCanonicalJSONRejectsLossyInput(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"a":1,"a":1}`,
		"{\"a\":\"\xff\"}",
		strings.Repeat("[", 200) + strings.Repeat("]", 200),
		`{"a":1e400}`,
		`{"a":1e-999999999}`,
		`{"a":123456789012345678901234567890123}`,
		`{"a":1} {"b":2}`,
		`{"a":}`,
		`nope`,
	} {
		if out, err := idem.CanonicalJSON([]byte(body), nil); err == nil {
			t.Errorf("CanonicalJSON(%.60q) = %s, want an error", body, out)
		}
	}
}

func TestReadBody(t *testing.T) {
	t.Parallel()
	if b, err := idemadapter.ReadBody(strings.NewReader("12345"), 5); err != nil || string(b) != "12345" {
		t.Fatalf("body at the limit: %q, %v", b, err)
	}
	if _, err := idemadapter.ReadBody(strings.NewReader("123456"), 5); !errors.Is(err, idemadapter.ErrBodyTooLarge) {
		t.Fatalf("body past the limit: %v", err)
	}
	if _, err := idemadapter.ReadBody(iotest.ErrReader(errors.New("reset")), 5); err == nil || errors.Is(err, idemadapter.ErrBodyTooLarge) {
		t.Fatalf("broken body: %v", err)
	}
	if b, err := idemadapter.ReadBody(nil, 5); err != nil || b != nil {
		t.Fatalf("nil body: %q %v", b, err)
	}
}

var jsonSeeds = []string{
	`{"amount":1000,"currency":"EUR","description":"coffee"}`,
	`{"b":[1,2,{"c":null}],"a":true}`, `[]`, `{}`, `0`, `-0`, `1e308`, `5e-324`, `"\ud83d\ude00"`,
	`{"a":9007199254740993}`, `{"a":1,"a":2}`, `{"\u20ac":1,"\ud83d\ude00":2,"a":3}`, "{\"a\":\"\xff\"}",
	strings.Repeat("[", 130) + strings.Repeat("]", 130), `{"sent_at":1,"meta":{"sent_at":2}}`,
	`{"a":1E+2}`, `{"a":0.1}`, `{"a":123456789012345678}`,
}

// FuzzCanonicalJSON checks that CanonicalJSON never panics, that what it
// accepts is canonical (a fixed point, equal to jcs.Transform of the input
// and to the input's value), and that what it rejects is hashed raw.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := idem.CanonicalJSON(body, nil)
		if err != nil {
			return
		}
		// A canonical form need not be accepted again (2^60 canonicalises
		// to 1152921504606847000, not itself an exact double), but when it
		// is, it is a fixed point.
		if again, err := idem.CanonicalJSON(out, nil); err == nil && !bytes.Equal(again, out) {
			t.Fatalf("canonical form %q is not a fixed point: %q", out, again)
		}
		ref, err := jcs.Transform(body)
		if err != nil || !bytes.Equal(ref, out) {
			t.Fatalf("CanonicalJSON(%q) = %q, jcs.Transform = %q, %v", body, out, ref, err)
		}
		var v1, v2 any
		if json.Unmarshal(body, &v1) != nil || json.Unmarshal(out, &v2) != nil || !reflect.DeepEqual(v1, v2) {
			t.Fatalf("canonical form %q does not hold the value of %q", out, body)
		}
	})
}

// FuzzFingerprint checks that Fingerprint never panics, is deterministic,
// FingerprintSize bytes with the version first, and ignores key order for JSON that canonicalises.
func FuzzFingerprint(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add("POST", "/payments", "alice", "application/json", []byte(s))
	}
	f.Add("POST", "/p", "", "text/plain", []byte("\x00\xff"))
	f.Add("PUT", "/p?q=1", "bob", "application/json; charset=\"", []byte("{"))
	f.Fuzz(func(t *testing.T, method, path, principal, ct string, body []byte) {
		a := idemadapter.Fingerprint(storetest.FingerprintKey, method, path, principal, ct, body, []string{"sent_at"})
		b := idemadapter.Fingerprint(storetest.FingerprintKey, method, path, principal, ct, bytes.Clone(body), []string{"sent_at"})
		if len(a) != idemstore.FingerprintSize || a[0] != idemadapter.FingerprintVersion || !bytes.Equal(a, b) {
			t.Fatalf("fingerprint not deterministic: %x vs %x", a, b)
		}
		canon, err := idem.CanonicalJSON(body, nil)
		if _, again := idem.CanonicalJSON(canon, nil); err == nil && again == nil && ct == "application/json" {
			if c := idemadapter.Fingerprint(storetest.FingerprintKey, method, path, principal, ct, canon, []string{"sent_at"}); !bytes.Equal(a, c) {
				t.Fatalf("body %q and its canonical form %q fingerprint differently", body, canon)
			}
		}
	})
}

// TestCanonicalJSONIgnoresOrderAndIgnoredFields: a retry whose JSON differs
// only in key order, white space or an ignored field canonicalises to the
// same bytes, so it has the same fingerprint.
func TestCanonicalJSONIgnoresOrderAndIgnoredFields(t *testing.T) {
	t.Parallel()
	a, errA := idem.CanonicalJSON([]byte(`{"currency":"EUR", "amount":1000, "sent_at":"10:00"}`), []string{"sent_at"})
	b, errB := idem.CanonicalJSON([]byte(`{"amount":1000,"currency":"EUR","sent_at":"10:05"}`), []string{"sent_at"})
	if errA != nil || errB != nil || string(a) != `{"amount":1000,"currency":"EUR"}` || string(a) != string(b) {
		t.Fatalf("canonical forms %s (%v) and %s (%v), want both {\"amount\":1000,\"currency\":\"EUR\"}", a, errA, b, errB)
	}
}
