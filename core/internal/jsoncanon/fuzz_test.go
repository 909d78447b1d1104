package jsoncanon

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
)

// fuzzSeeds are real edge cases: every rejection class, the RFC 8785
// vectors, sorting across the UTF-16/UTF-8 order difference, and ignore
// paths through objects and arrays.
var fuzzSeeds = []struct {
	body   string
	ignore string // comma-separated dotted paths
}{
	{`{"amount":1000,"currency":"EUR","description":"coffee"}`, ""},
	{`{"currency":"EUR","amount":1000,"sent_at":"2026-11-30T02:44:06Z"}`, "sent_at"},
	{`{"b":[1,2,{"c":null}],"a":true}`, ""},
	{`[]`, ""}, {`{}`, ""}, {`0`, ""}, {`-0`, ""}, {`-0.0`, ""}, {`0e400`, ""}, {`0e401`, ""},
	{`1e308`, ""}, {`5e-324`, ""}, {`1e21`, ""}, {`1e-7`, ""}, {`1E+2`, ""}, {`4.50`, ""},
	{`9.5367431640625e-7`, ""}, {`295147905179352825856`, ""}, {`1152921504606846976`, ""},
	{`9007199254740993`, ""}, {`9007199254740992`, ""}, {`0.10000000000000000001`, ""},
	{`1.7976931348623157e308`, ""}, {`333333333.33333329`, ""}, {`123456789012345678`, ""},
	{`123456789012345678901234567890123`, ""}, {`1e-999999999`, ""}, {`0.1`, ""},
	{`"\ud83d\ude00"`, ""}, {`"\ud800"`, ""}, {`"\udc00"`, ""}, {`"\ud800\u0041"`, ""}, {`"\ufffd"`, ""},
	{"\"\uFFFD\"", ""}, {"{\"a\":\"\xff\"}", ""}, {`"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"`, ""},
	{`{"\u20ac":1,"\r":2,"\ufb33":3,"1":4,"\ud83d\ude00":5,"\u0080":6,"\u00f6":7}`, ""},
	{"{\"\uffff\":1,\"\U00010000\":2,\"\ue000\":3}", ""},
	{`{"a":1,"a":2}`, ""}, {`{"a":1,"\u0061":2}`, ""}, {`{"sent_at":1,"sent_at":2}`, "sent_at"},
	{strings.Repeat("[", 129) + strings.Repeat("]", 129), ""},
	{strings.Repeat("[", 130) + strings.Repeat("]", 130), ""},
	{strings.Repeat(`{"a":`, 128) + "1" + strings.Repeat("}", 128), ""},
	{`{"sent_at":1,"meta":{"sent_at":2,"v":[{"sent_at":3}]}}`, "sent_at,meta.sent_at"},
	{`{"z":1,"meta":{"z":[1,{"y":2,"x":3}],"sent_at":{"q":[2,1]}},"a":0}`, "meta.sent_at"},
	{`{"a":[{"b":1,"c":2}]}`, "a.\x00[].b"},
	{`{"c":[{"a":1,"b":2},{"b":{"a":{"b":1,"c":0}},"a":[]}],"b":{"c":1,"a":{"b":2,"a":1}},"d":{"":1,"x":2},"":{"e":1}}`, ""},
	{`[{"b":1,"a":{"b":{"c":1}}},{"d":{"":[1]}}]`, ""},
	{`[{"b":1}]`, "\x00[].b"},
	{`{"":{"":1}}`, "."},
	{`{"a":1} {"b":2}`, ""}, {`{"a":}`, ""}, {`nope`, ""}, {`[1,]`, ""}, {`truex`, ""}, {" \t\r\n[ 1 ]\n", ""},
	{"\"\x7f\u2028<>&\"", ""},
}

// fixedPaths are ignore paths over the short names the seeds use, so that
// mutated bodies keep meeting paths that match, partly match, or continue
// through arrays.
var fixedPaths = []string{"a", "b.c", "b.a.b", "c.\x00[].a", "\x00[].b", "d.", ".e", "sent_at", "meta.sent_at"}

// FuzzAgainstJCS holds Append to the reference implementation (same
// decision, same bytes, with and without ignore paths) and to jcs.Transform
// (whatever Append accepts, jcs accepts with the same bytes), and checks
// that Append appends to dst.
func FuzzAgainstJCS(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s.body), s.ignore)
	}
	f.Fuzz(func(t *testing.T, body []byte, ignore string) {
		var paths []string
		if ignore != "" {
			paths = strings.Split(ignore, ",")
		}
		for _, ps := range [][]string{nil, paths, fixedPaths} {
			got, err := Append(nil, body, SplitPaths(ps))
			want, refErr := referenceCanonical(body, ps)
			if (err == nil) != (refErr == nil) {
				t.Fatalf("Append(%q, %q): error %v, reference error %v", body, ps, err, refErr)
			}
			if err != nil {
				continue
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("Append(%q, %q) = %q, reference %q", body, ps, got, want)
			}
			// Append appends; the canonical form is canonicalised like
			// any other input. (It is not always a fixed point: the
			// exact 2^60 prints as 1152921504606847000, which is not.)
			again, err := Append([]byte("dst:"), got, nil)
			want2, refErr2 := referenceCanonical(got, nil)
			if (err == nil) != (refErr2 == nil) || err == nil && string(again) != "dst:"+string(want2) ||
				err != nil && string(again) != "dst:" {
				t.Fatalf("Append(%q) = %q, %v; reference %q, %v", got, again, err, want2, refErr2)
			}
			if ps != nil {
				continue
			}
			ref, err := jcs.Transform(body)
			if err != nil || !bytes.Equal(ref, got) {
				t.Fatalf("Append(%q) = %q, jcs.Transform = %q, %v", body, got, ref, err)
			}
		}
	})
}

// FuzzNumber holds the number path (exactness decision and ECMAScript
// form) to the reference on bare literals.
func FuzzNumber(f *testing.F) {
	for _, s := range []string{"0", "-0", "1e21", "1e-7", "5e-324", "4.50", "9007199254740993",
		"1152921504606846976", "0.0000019073486328125", "1e400", "0e401", "12.5e-1", "1E+2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, lit string) {
		got, err := Append(nil, []byte(lit), nil)
		want, refErr := referenceCanonical([]byte(lit), nil)
		if (err == nil) != (refErr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("%q: Append = %q, %v; reference = %q, %v", lit, got, err, want, refErr)
		}
	})
}
