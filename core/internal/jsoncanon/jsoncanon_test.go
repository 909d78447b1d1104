package jsoncanon

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
)

// canon runs Append with dotted ignore paths.
func canon(body string, ignore ...string) (string, error) {
	out, err := Append(nil, []byte(body), SplitPaths(ignore))
	return string(out), err
}

func TestAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
		ignore   []string
	}{
		// Structure and white space.
		{`{"amount":1000,"currency":"EUR","description":"coffee"}`, `{"amount":1000,"currency":"EUR","description":"coffee"}`, nil},
		{" { \"b\" :\n[ 1 , 2 ,{ \"c\" : null } ] ,\t\"a\":true }\r\n", `{"a":true,"b":[1,2,{"c":null}]}`, nil},
		{`[]`, `[]`, nil},
		{`{}`, `{}`, nil},
		{` [ ] `, `[]`, nil},
		{`{"a":{},"b":[]}`, `{"a":{},"b":[]}`, nil},
		{`true`, `true`, nil},
		{`false`, `false`, nil},
		{`null`, `null`, nil},
		{`"x"`, `"x"`, nil},
		{`[[[[]]]]`, `[[[[]]]]`, nil},
		{`{"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]}`, `{"a":[{"c":2,"d":1}],"z":{"x":2,"y":1}}`, nil},

		// Numbers: exact doubles in ECMAScript form (RFC 8785 §3.2.2.3).
		{`0`, `0`, nil},
		{`-0`, `0`, nil},
		{`-0.0`, `0`, nil},
		{`0e400`, `0`, nil},
		{`-0E-400`, `0`, nil},
		{`100`, `100`, nil},
		{`1e2`, `100`, nil},
		{`1E+2`, `100`, nil},
		{`1.0`, `1`, nil},
		{`1.500`, `1.5`, nil},
		{`4.50`, `4.5`, nil},
		{`0.25e1`, `2.5`, nil},
		{`-12.5`, `-12.5`, nil},
		{`123456789012345`, `123456789012345`, nil},
		{`-123456789012345`, `-123456789012345`, nil},
		{`1000000000000000`, `1000000000000000`, nil},
		{`9007199254740992`, `9007199254740992`, nil},
		{`-9007199254740992`, `-9007199254740992`, nil},
		{`9007199254740994`, `9007199254740994`, nil},
		{`1152921504606846976`, `1152921504606847000`, nil},
		{`295147905179352825856`, `295147905179352830000`, nil},
		{`1e20`, `100000000000000000000`, nil},
		{`1e21`, `1e+21`, nil},
		{`1e22`, `1e+22`, nil},
		{`-1e21`, `-1e+21`, nil},
		{`0.5`, `0.5`, nil},
		{`0.0000019073486328125`, `0.0000019073486328125`, nil}, // 2^-19
		{`9.5367431640625e-7`, `9.5367431640625e-7`, nil},       // 2^-20
		{`95367431640625e-20`, `9.5367431640625e-7`, nil},
		{`7.450580596923828125e-9`, `7.450580596923828e-9`, nil}, // 2^-27
		// An empty want leaves the decision to the reference (both
		// refuse these: neither literal is exactly a double).
		{`1e308`, ``, nil},
		{`8.98846567431158e307`, ``, nil},

		// Strings (RFC 8785 §3.2.2.2).
		{`"\u20ac"`, `"€"`, nil},
		{`"\ud83d\ude00"`, `"😀"`, nil},
		{`"\uD83D\uDE00"`, `"😀"`, nil},
		{`"\u000f"`, `"\u000f"`, nil},
		{`"\u001F"`, `"\u001f"`, nil},
		{`"\u0000"`, `"\u0000"`, nil},
		{`"\u0008\u0009\u000a\u000c\u000d"`, `"\b\t\n\f\r"`, nil},
		{`"\b\t\n\f\r"`, `"\b\t\n\f\r"`, nil},
		{`"\/"`, `"/"`, nil},
		{`"\u007f\u0080"`, "\"\x7f\u0080\"", nil},
		{`"\u2028\u2029<>&"`, "\"\u2028\u2029<>&\"", nil},
		{`"\u0022\u005c"`, `"\"\\"`, nil},
		{"\"é\x7f\"", "\"é\x7f\"", nil},
		{`"\uE000\uFFFF"`, "\"\uE000\uFFFF\"", nil},
		{`{"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"}`, `{"string":"€$\u000f\nA'B\"\\\\\"/"}`, nil},

		// Member order by UTF-16 code units (RFC 8785 §3.2.3).
		{`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}", nil},
		{"{\"\uffff\":1,\"\U00010000\":2,\"\ue000\":3,\"\U0010ffff\":4,\"\ud7ff\":5}",
			"{\"\ud7ff\":5,\"\U00010000\":2,\"\U0010ffff\":4,\"\ue000\":3,\"\uffff\":1}", nil},
		{`{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`, nil},
		{`{"\u0061b":1,"a\u0000":2}`, `{"a\u0000":2,"ab":1}`, nil},

		// Ignore paths.
		{`{"amount":1,"sent_at":"10:00"}`, `{"amount":1}`, []string{"sent_at"}},
		{`{"sent_at":"10:00","amount":1}`, `{"amount":1}`, []string{"sent_at"}},
		{`{"sent_at":1}`, `{}`, []string{"sent_at"}},
		{`{"meta":{"sent_at":1,"v":2}}`, `{"meta":{"v":2}}`, []string{"meta.sent_at"}},
		{`{"x":{"sent_at":1}}`, `{"x":{"sent_at":1}}`, []string{"sent_at"}},
		{`[{"sent_at":1}]`, `[{"sent_at":1}]`, []string{"sent_at"}},
		{`{"a":[{"b":1}]}`, `{"a":[{"b":1}]}`, []string{"a.b"}},
		{`{"a":[{"b":1,"c":2}]}`, `{"a":[{"c":2}]}`, []string{"a.\x00[].b"}},
		{`{"sent\u005fat":1,"b":2}`, `{"b":2}`, []string{"sent_at"}},
		{`{"z":1,"meta":{"z":[1,{"y":2,"x":3}],"sent_at":{"q":[2,1]}},"a":0}`, `{"a":0,"meta":{"z":[1,{"x":3,"y":2}]},"z":1}`, []string{"meta.sent_at"}},
		{`{"a":1,"b":2,"c":3}`, `{}`, []string{"a", "b", "c", "", "d.e"}},
		{`{"a":{"b":{"c":1,"d":2}}}`, `{"a":{"b":{"d":2}}}`, []string{"a.b.c"}},
		{`{"a":{"b":{"c":1,"d":2}}}`, `{}`, []string{"a.b.c", "a"}},
		{`{"":{"":1,"x":2}}`, `{"":{"x":2}}`, []string{"."}},
	}
	for _, tc := range tests {
		want, wantErr := referenceCanonical([]byte(tc.in), tc.ignore)
		got, err := canon(tc.in, tc.ignore...)
		if (err == nil) != (wantErr == nil) {
			t.Errorf("Append(%q, %q): error %v, reference error %v", tc.in, tc.ignore, err, wantErr)
			continue
		}
		if tc.want == "" { // the reference decides
			if got != string(want) {
				t.Errorf("Append(%q) = %q, reference %q", tc.in, got, want)
			}
			continue
		}
		if err != nil {
			t.Errorf("Append(%q, %q): %v", tc.in, tc.ignore, err)
			continue
		}
		if got != tc.want || got != string(want) {
			t.Errorf("Append(%q, %q) = %q, want %q (reference %q)", tc.in, tc.ignore, got, tc.want, want)
		}
	}
}

func TestRejects(t *testing.T) {
	t.Parallel()
	deep := func(n int, inner string) string {
		return strings.Repeat("[", n) + inner + strings.Repeat("]", n)
	}
	deepObj := strings.Repeat(`{"a":`, 129) + "1" + strings.Repeat("}", 129)
	for _, tc := range []struct {
		class, body string
		ignore      []string
	}{
		{"invalid UTF-8", "{\"a\":\"\xff\"}", nil},
		{"invalid UTF-8", "\"\xc3\"", nil},
		{"invalid UTF-8", "\"\xed\xa0\x80\"", nil}, // an encoded surrogate
		{"invalid UTF-8", "[1]\xff", nil},
		{"invalid UTF-8 in ignored member", "{\"s\":\"\xe2\x82\"}", []string{"s"}},
		{"duplicate", `{"a":1,"a":1}`, nil},
		{"duplicate", `{"a":1,"a":2}`, nil},
		{"duplicate", `{"b":1,"a":2,"b":3}`, nil},
		{"duplicate after unescaping", `{"a":1,"\u0061":2}`, nil},
		{"duplicate nested", `[{"x":{"k":1,"k":1}}]`, nil},
		{"duplicate ignored member", `{"sent_at":1,"sent_at":2}`, []string{"sent_at"}},
		{"duplicate inside ignored member", `{"sent_at":{"k":1,"k":2}}`, []string{"sent_at"}},
		{"too deep", deep(130, ""), nil},
		{"too deep", deep(129, "1"), nil},
		{"too deep", deep(200, ""), nil},
		{"too deep", deep(100000, ""), nil},
		{"too deep", deepObj, nil},
		{"inexact", `9007199254740993`, nil},
		{"inexact", `{"a":9007199254740993}`, nil},
		{"inexact", `0.10000000000000000001`, nil},
		{"inexact", `0.1`, nil},
		{"inexact", `12.34`, nil},
		{"inexact", `1e-7`, nil},
		{"inexact", `1e23`, nil},
		{"inexact", `5e-324`, nil},
		{"inexact", `1.7976931348623157e308`, nil},
		{"inexact", `333333333.33333329`, nil},
		{"inexact", `123456789012345678`, nil},
		{"inexact in ignored member", `{"a":0.1}`, []string{"a"}},
		{"too long", `123456789012345678901234567890123`, nil},
		{"too long", `{"a":1.0000000000000000000000000000000}`, nil},
		{"exponent", `1e400`, nil},
		{"exponent", `1e401`, nil},
		{"exponent", `0e401`, nil},
		{"exponent", `0E-401`, nil},
		{"exponent", `1e-999999999`, nil},
		{"exponent", `1e99999999999999999999999`, nil},
		{"U+FFFD", "\"\uFFFD\"", nil},
		{"U+FFFD", `"\uFFFD"`, nil},
		{"U+FFFD", `{"\ufffd":1}`, nil},
		{"lone surrogate", `"\ud800"`, nil},
		{"lone surrogate", `"\udc00"`, nil},
		{"lone surrogate", `"\ud800x"`, nil},
		{"lone surrogate", `"\ud800\u0041"`, nil},
		{"lone surrogate", `"\ud800\ud800"`, nil},
		{"lone surrogate", `"\ude00\ud83d"`, nil},
		{"lone surrogate", `{"\ud800":1}`, nil},
		{"lone surrogate in ignored member", `{"a":"\udfff"}`, []string{"a"}},
		{"trailing data", `{"a":1} {"b":2}`, nil},
		{"trailing data", `1 2`, nil},
		{"trailing data", `[]]`, nil},
		{"trailing data", `truex`, nil},
		{"trailing data", `"a""b"`, nil},
		{"invalid", ``, nil},
		{"invalid", ` `, nil},
		{"invalid", `{"a":}`, nil},
		{"invalid", `nope`, nil},
		{"invalid", `{`, nil},
		{"invalid", `[`, nil},
		{"invalid", `[1,]`, nil},
		{"invalid", `[,1]`, nil},
		{"invalid", `[1 2]`, nil},
		{"invalid", `{"a":1,}`, nil},
		{"invalid", `{,"a":1}`, nil},
		{"invalid", `{"a" 1}`, nil},
		{"invalid", `{"a":1 "b":2}`, nil},
		{"invalid", `{1:2}`, nil},
		{"invalid", `{a:1}`, nil},
		{"invalid", `[1}`, nil},
		{"invalid", `{"a":1]`, nil},
		{"invalid", `01`, nil},
		{"invalid", `-`, nil},
		{"invalid", `+1`, nil},
		{"invalid", `.5`, nil},
		{"invalid", `1.`, nil},
		{"invalid", `1e`, nil},
		{"invalid", `1e+`, nil},
		{"invalid", `0x10`, nil},
		{"invalid", `NaN`, nil},
		{"invalid", `tru`, nil},
		{"invalid", `nul`, nil},
		{"invalid", `"abc`, nil},
		{"invalid", `"\x"`, nil},
		{"invalid", `"\u12"`, nil},
		{"invalid", `"\u12g4"`, nil},
		{"invalid", "\"a\tb\"", nil},
		{"invalid", "\"a\x00b\"", nil},
		{"invalid", "\ufeff{}", nil},
		{"invalid", "{}\x00", nil},
		{"invalid", "\v1", nil},
	} {
		if _, err := referenceCanonical([]byte(tc.body), tc.ignore); err == nil {
			t.Errorf("%s: the reference accepts %.60q", tc.class, tc.body)
		}
		out, err := Append([]byte("prefix"), []byte(tc.body), SplitPaths(tc.ignore))
		if err == nil {
			t.Errorf("%s: Append(%.60q) = %q, want an error", tc.class, tc.body, out)
			continue
		}
		if !errors.Is(err, ErrNotCanonical) {
			t.Errorf("%s: error %v does not wrap ErrNotCanonical", tc.class, err)
		}
		if string(out) != "prefix" {
			t.Errorf("%s: Append returned %q on error, want the original dst", tc.class, out)
		}
	}
}

func TestDepthLimit(t *testing.T) {
	t.Parallel()
	for n := 126; n <= 131; n++ {
		for _, inner := range []string{"", "1", "{}", `{"a":1}`} {
			body := strings.Repeat("[", n) + inner + strings.Repeat("]", n)
			_, err := canon(body)
			_, refErr := referenceCanonical([]byte(body), nil)
			if (err == nil) != (refErr == nil) {
				t.Errorf("depth %d %q: error %v, reference %v", n, inner, err, refErr)
			}
		}
	}
	if _, err := canon(strings.Repeat("[", 129) + strings.Repeat("]", 129)); err != nil {
		t.Errorf("129 nested empty arrays: %v", err)
	}
}

// TestAppendsToDst checks that Append appends, including when objects must
// be reordered in a second pass.
func TestAppendsToDst(t *testing.T) {
	t.Parallel()
	dst := make([]byte, 0, 4)
	dst = append(dst, "abc"...)
	out, err := Append(dst, []byte(`{"b":{"d":1,"c":2},"a":[{"f":1,"e":2}]}`), nil)
	if err != nil || string(out) != `abc{"a":[{"e":2,"f":1}],"b":{"c":2,"d":1}}` {
		t.Fatalf("Append = %q, %v", out, err)
	}
}

// RFC 8785 Appendix B: IEEE 754 bit patterns and their ECMAScript form.
var rfcNumbers = []struct {
	bits uint64
	want string
}{
	{0x0000000000000000, "0"},
	{0x8000000000000000, "0"},
	{0x0000000000000001, "5e-324"},
	{0x8000000000000001, "-5e-324"},
	{0x7fefffffffffffff, "1.7976931348623157e+308"},
	{0xffefffffffffffff, "-1.7976931348623157e+308"},
	{0x4340000000000000, "9007199254740992"},
	{0xc340000000000000, "-9007199254740992"},
	{0x4430000000000000, "295147905179352830000"},
	{0x44b52d02c7e14af5, "9.999999999999997e+22"},
	{0x44b52d02c7e14af6, "1e+23"},
	{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
	{0x444b1ae4d6e2ef4e, "999999999999999700000"},
	{0x444b1ae4d6e2ef4f, "999999999999999900000"},
	{0x444b1ae4d6e2ef50, "1e+21"},
	{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
	{0x3eb0c6f7a0b5ed8d, "0.000001"},
	{0x41b3de4355555553, "333333333.3333332"},
	{0x41b3de4355555554, "333333333.33333325"},
	{0x41b3de4355555555, "333333333.3333333"},
	{0x41b3de4355555556, "333333333.3333334"},
	{0x41b3de4355555557, "333333333.33333343"},
	{0xbecbf647612f3696, "-0.0000033333333333333333"},
	{0x43143ff3c1cb0959, "1424953923781206.2"},
}

func TestNumberFormatRFC8785(t *testing.T) {
	t.Parallel()
	for _, tc := range rfcNumbers {
		f := math.Float64frombits(tc.bits)
		if got := string(appendNumber(nil, f)); got != tc.want {
			t.Errorf("appendNumber(%#016x) = %s, want %s", tc.bits, got, tc.want)
		}
	}
}

// TestNumberFormatAgainstJCS compares appendNumber with jcs.NumberToJSON on
// random doubles of every magnitude.
func TestNumberFormatAgainstJCS(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 1_000_000; i++ {
		f := math.Float64frombits(r.Uint64())
		if i%3 == 0 {
			f = math.Ldexp(float64(r.Int64N(1<<53)), int(r.Int64N(200))-100)
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		want, err := jcs.NumberToJSON(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(appendNumber(nil, f)); got != want {
			t.Fatalf("appendNumber(%#016x) = %s, jcs %s", math.Float64bits(f), got, want)
		}
	}
}

// TestExactNumbersAgainstReference checks the exactness decision on number
// literals built around exact and inexact doubles.
func TestExactNumbersAgainstReference(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	var lits []string
	for i := 0; i < 40_000; i++ {
		var f float64
		switch i % 4 {
		case 0:
			f = math.Ldexp(float64(r.Int64N(1<<20)), int(r.Int64N(80))-60)
		case 1:
			f = math.Ldexp(float64(r.Int64N(1<<53)), int(r.Int64N(60))-30)
		case 2:
			f = math.Float64frombits(r.Uint64())
		default:
			f = float64(r.Int64N(1e6)) / 100
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		for _, fm := range []byte{'e', 'f', 'g'} {
			lits = append(lits, strconv.FormatFloat(f, fm, -1, 64))
		}
		lits = append(lits, strconv.FormatFloat(f, 'f', int(r.Int64N(30)), 64))
		lits = append(lits, strconv.FormatFloat(f, 'e', int(r.Int64N(30)), 64))
	}
	for _, lit := range lits {
		lit = strings.Replace(lit, "e+", []string{"e", "E+", "e+0"}[len(lit)%3], 1)
		got, err := canon(lit)
		want, refErr := referenceCanonical([]byte(lit), nil)
		if (err == nil) != (refErr == nil) || got != string(want) {
			t.Fatalf("%s: Append = %q, %v; reference = %q, %v", lit, got, err, want, refErr)
		}
	}
}

func TestCompareNamesUTF16(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	runes := []rune{0, 'a', 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfb33, 0xffff, 0x10000, 0x1f600, 0x10ffff}
	utf16Key := func(s string) []uint16 {
		var k []uint16
		for _, c := range s {
			if c >= 0x10000 {
				c -= 0x10000
				k = append(k, uint16(0xd800+c>>10), uint16(0xdc00+c&0x3ff))
			} else {
				k = append(k, uint16(c))
			}
		}
		return k
	}
	for i := 0; i < 100_000; i++ {
		var a, b strings.Builder
		for n := r.IntN(4); n > 0; n-- {
			a.WriteRune(runes[r.IntN(len(runes))])
		}
		for n := r.IntN(4); n > 0; n-- {
			b.WriteRune(runes[r.IntN(len(runes))])
		}
		ka, kb := utf16Key(a.String()), utf16Key(b.String())
		want := 0
		for j := 0; j < min(len(ka), len(kb)) && want == 0; j++ {
			want = int(ka[j]) - int(kb[j])
		}
		if want == 0 {
			want = len(ka) - len(kb)
		}
		got := compareNames([]byte(a.String()), []byte(b.String()))
		if (got < 0) != (want < 0) || (got == 0) != (want == 0) {
			t.Fatalf("compareNames(%q, %q) = %d, want sign of %d", a.String(), b.String(), got, want)
		}
	}
}

func TestAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	body := []byte(paymentBody)
	buf := make([]byte, 0, 256)
	ignore := SplitPaths([]string{"sent_at"})
	if _, err := Append(buf, body, ignore); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = Append(buf, body, ignore) }); n != 0 {
		t.Errorf("Append allocates %v times per call with a large enough dst", n)
	}
	nested := []byte(nestedBody(4096))
	buf = make([]byte, 0, 2*len(nested))
	if n := testing.AllocsPerRun(100, func() { _, _ = Append(buf, nested, nil) }); n != 0 {
		t.Errorf("Append allocates %v times per call on the nested body", n)
	}
}

// TestAdversarialNesting checks that deep nesting of out-of-order objects
// costs no more than linear work: each level holds a large sibling.
func TestAdversarialNesting(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for i := 0; i < 127; i++ {
		b.WriteString(`{"b":`)
	}
	b.WriteString(`"` + strings.Repeat("x", 1<<16) + `"`)
	for i := 0; i < 127; i++ {
		b.WriteString(`,"a":0}`)
	}
	got, err := canon(b.String())
	want, refErr := referenceCanonical([]byte(b.String()), nil)
	if err != nil || refErr != nil || got != string(want) {
		t.Fatalf("Append: %v; reference: %v; equal: %v", err, refErr, got == string(want))
	}
}

const paymentBody = `{"currency":"EUR","amount":1000,"description":"coffee"}`

// nestedBody returns an order-like document of about size bytes with
// unsorted members, nesting, escapes and exact numbers.
func nestedBody(size int) string {
	var b strings.Builder
	b.WriteString(`{"order_id":"ord_8f14e45fceea167a","customer":{"name":"Zoë Müller","email":"zoe@example.com","address":{"street":"Hauptstraße 5","city":"Köln","zip":"50667","country":"DE"}},"items":[`)
	for i := 0; b.Len() < size-120; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%04d","qty":%d,"unit_price":%d.5,"tags":["a\u00e9","b"],"meta":{"gift":%t,"note":null}}`, i, i%7+1, 100+i, i%2 == 0)
	}
	b.WriteString(`],"total":12345.25,"sent_at":"2026-11-30T02:44:06Z","currency":"EUR"}`)
	return b.String()
}

func TestBenchmarkBodies(t *testing.T) {
	t.Parallel()
	for _, body := range []string{paymentBody, nestedBody(4096)} {
		got, err := canon(body)
		want, refErr := referenceCanonical([]byte(body), nil)
		if err != nil || refErr != nil || got != string(want) {
			t.Fatalf("%.40s…: Append %v, reference %v, equal %v", body, err, refErr, got == string(want))
		}
	}
}

func BenchmarkCanonical(b *testing.B) {
	bodies := []struct{ name, body string }{
		{"payment60B", paymentBody},
		{"nested4KB", nestedBody(4096)},
	}
	ignore := []string{"sent_at"}
	split := SplitPaths(ignore)
	for _, bb := range bodies {
		body := []byte(bb.body)
		b.Run("body="+bb.name+"/impl=reference", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := referenceCanonical(body, ignore); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("body="+bb.name+"/impl=jsoncanon", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var buf []byte
			for b.Loop() {
				var err error
				if buf, err = Append(buf[:0], body, split); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAdversarial measures 127 levels of out-of-order objects around
// a 64 KB string, the shape that costs a naive reorder-in-place
// implementation a copy per level.
func BenchmarkAdversarial(b *testing.B) {
	var sb strings.Builder
	for i := 0; i < 127; i++ {
		sb.WriteString(`{"b":`)
	}
	sb.WriteString(`"` + strings.Repeat("x", 1<<16) + `"`)
	for i := 0; i < 127; i++ {
		sb.WriteString(`,"a":0}`)
	}
	body := []byte(sb.String())
	b.Run("impl=reference", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = referenceCanonical(body, nil)
		}
	})
	b.Run("impl=jsoncanon", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf, _ = Append(buf[:0], body, nil)
		}
	})
}
