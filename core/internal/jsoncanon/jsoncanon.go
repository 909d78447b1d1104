// Package jsoncanon writes the RFC 8785 (JCS) canonical form of a JSON
// document in a single validating pass, with few allocations.
//
// It implements exactly the semantics of idem.CanonicalJSON: a document is
// refused, rather than canonicalised, whenever its canonical form would lose
// information. Refused are invalid JSON, invalid UTF-8, trailing data,
// duplicate object members (compared after unescaping), nesting deeper than
// 128 levels, strings holding U+FFFD or a surrogate escape that is not part
// of a valid pair, and numbers that are not exactly a float64 (a literal
// longer than 32 bytes, or with an exponent beyond ±400, is refused without
// further work). Everything in the document is validated, including members
// left out by an ignore path.
package jsoncanon

import (
	"errors"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting accepted: the top-level value is at depth
// 0, and a value at depth MaxDepth+1 makes the document non-canonicalisable.
const MaxDepth = 128

// maxNumberLength bounds the length of a number literal that is checked for
// an exact float64 value.
const maxNumberLength = 32

// maxExponent bounds the magnitude of a number literal's exponent.
const maxExponent = 400

// ErrNotCanonical is wrapped by every error Append returns: the document is
// not JSON, or its canonical form would lose information.
var ErrNotCanonical = errors.New("jsoncanon: JSON cannot be canonicalised without losing information")

// The errors are allocated once so that refusing a document costs nothing.
var (
	errSyntax    = wrap("invalid JSON")
	errTrailing  = wrap("data after the JSON value")
	errUTF8      = wrap("invalid UTF-8")
	errDepth     = wrap("nested deeper than 128 levels")
	errDuplicate = wrap("duplicate object member")
	errString    = wrap("U+FFFD or a lone surrogate in a string")
	errNumber    = wrap("number is not an exact double")
)

type canonError struct{ msg string }

func (e *canonError) Error() string { return ErrNotCanonical.Error() + ": " + e.msg }
func (e *canonError) Unwrap() error { return ErrNotCanonical }

func wrap(msg string) error { return &canonError{msg} }

// arrayComponent is the path component an array element adds to the member
// path, as in idem.CanonicalJSON: an ignore path never matches through an
// array unless it spells this component out.
const arrayComponent = "\x00[]"

// SplitPaths turns ignore paths in dotted form ("sent_at", "meta.sent_at")
// into the form Append takes. Empty paths are dropped, as
// idem.CanonicalJSON does. Callers should split once, at configuration
// time, and reuse the result.
func SplitPaths(paths []string) [][]string {
	var out [][]string
	for _, p := range paths {
		if p != "" {
			out = append(out, strings.Split(p, "."))
		}
	}
	return out
}

// Append appends the RFC 8785 canonical form of the JSON document body to
// dst and returns the extended slice. Each element of ignore is a path of
// member names (see SplitPaths); an object member whose path from the top
// level, through objects only, equals an ignore path is left out of the
// output but still validated.
//
// When the document cannot be canonicalised without losing information,
// Append returns dst with its original length and an error wrapping
// ErrNotCanonical; the bytes of dst beyond that length may have been
// overwritten. dst must not share memory with body. Append does not retain
// body, dst or ignore.
//
// Like idem.CanonicalJSON, Append's output is not always accepted again:
// the exact double 2^60, written 1152921504606846976, canonicalises to
// 1152921504606847000, which is not exactly a double.
func Append(dst, body []byte, ignore [][]string) ([]byte, error) {
	s := scratchPool.Get().(*scratch)
	p := parser{in: body, out: dst, base: len(dst), s: s, ignore: ignore}
	out, err := p.run()
	s.release()
	if err != nil {
		return dst[:p.base], err
	}
	return out, nil
}

type scratch struct {
	stack   []member // members of the objects being parsed
	members []member // sorted members of objects written out of order
	objects []object // every object written, in document order
	arena   []byte   // unescaped names of members with escapes
	path    [][]byte // member names from the top level, while ignore paths are live
	tmp     []byte   // first-pass output when objects must be reordered
}

// maxRetained bounds the scratch kept in the pool between calls.
const maxRetained = 64 << 10

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func (s *scratch) release() {
	clear(s.path[:cap(s.path)])
	s.stack, s.members, s.objects = s.stack[:0], s.members[:0], s.objects[:0]
	s.arena, s.path, s.tmp = s.arena[:0], s.path[:0], s.tmp[:0]
	if cap(s.stack)+cap(s.members) > maxRetained/16 || cap(s.objects) > maxRetained/32 ||
		cap(s.arena) > maxRetained || cap(s.tmp) > maxRetained {
		return // let a huge scratch go rather than pin it
	}
	scratchPool.Put(s)
}

// member is one object member. Its name is in[nameOff:nameOff+nameLen], or
// the same range of arena when the name has escapes. start and end delimit
// `"name":value` in the first-pass output; obj is the number of objects
// written before its value.
type member struct {
	nameOff, nameLen int
	inArena          bool
	ignored          bool
	start, end       int
	obj              int
}

// Object states for the second pass.
const (
	objClean   = iota // members in order, and so is everything inside
	objInOrder        // members in order, but something inside is not
	objReorder        // members must be written in sorted order
)

// object is one object of the first-pass output: '{' at start, '}' at
// end-1. next is the index of the first object after it (and after all
// objects inside it). An objReorder object's sorted members are
// members[mBase:mBase+mLen].
type object struct {
	start, end  int
	mBase, mLen int
	next        int
	state       uint8
}

type parser struct {
	in     []byte
	i      int
	out    []byte
	base   int // len(out) when Append was called; positions are relative to it
	s      *scratch
	ignore [][]string
}

func (p *parser) run() ([]byte, error) {
	live := false
	for _, ip := range p.ignore {
		if len(ip) > 0 {
			live = true
		}
	}
	p.skipSpace()
	clean, err := p.value(0, live)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.i != len(p.in) {
		return nil, errTrailing
	}
	if clean {
		return p.out, nil
	}
	// Second pass: copy the first-pass output aside and write it back with
	// every out-of-order object's members in sorted order. Each byte is
	// copied once whatever the nesting, so the cost stays linear.
	s := p.s
	s.tmp = append(s.tmp[:0], p.out[p.base:]...)
	return p.emit(p.out[:p.base], s.tmp, 0, len(s.tmp), 0), nil
}

func (p *parser) emit(dst, src []byte, a, b, oi int) []byte {
	objs := p.s.objects
	for oi < len(objs) && objs[oi].start < b {
		o := &objs[oi]
		switch o.state {
		case objClean:
			oi = o.next
		case objInOrder:
			oi++
		default:
			dst = append(dst, src[a:o.start]...)
			dst = append(dst, '{')
			for j, m := range p.s.members[o.mBase : o.mBase+o.mLen] {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = p.emit(dst, src, m.start, m.end, m.obj)
			}
			dst = append(dst, '}')
			a, oi = o.end, o.next
		}
	}
	return append(dst, src[a:b]...)
}

func (p *parser) pos() int { return len(p.out) - p.base }

func (p *parser) skipSpace() {
	for p.i < len(p.in) {
		switch p.in[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value parses the value at p.i (after white space) and writes its
// canonical form. It reports whether everything written is already in
// canonical order. live reports whether an ignore path may match a member
// inside the value.
func (p *parser) value(depth int, live bool) (bool, error) {
	if depth > MaxDepth {
		return false, errDepth
	}
	if p.i >= len(p.in) {
		return false, errSyntax
	}
	switch c := p.in[p.i]; c {
	case '{':
		return p.object(depth, live)
	case '[':
		return p.array(depth, live)
	case '"':
		return true, p.stringValue()
	case 't':
		return true, p.literal("true")
	case 'f':
		return true, p.literal("false")
	case 'n':
		return true, p.literal("null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return true, p.number()
		}
		return false, errSyntax
	}
}

func (p *parser) literal(lit string) error {
	if len(p.in)-p.i < len(lit) || string(p.in[p.i:p.i+len(lit)]) != lit {
		return errSyntax
	}
	p.i += len(lit)
	p.out = append(p.out, lit...)
	return nil
}

func (p *parser) array(depth int, live bool) (bool, error) {
	p.i++ // '['
	p.out = append(p.out, '[')
	p.skipSpace()
	if p.i < len(p.in) && p.in[p.i] == ']' {
		p.i++
		p.out = append(p.out, ']')
		return true, nil
	}
	s := p.s
	pushed := false
	if live {
		// Array elements extend the path by arrayComponent.
		live = p.matchArray()
		if live {
			s.path = append(s.path, []byte(arrayComponent))
			pushed = true
		}
	}
	clean := true
	for {
		c, err := p.value(depth+1, live)
		if err != nil {
			return false, err
		}
		clean = clean && c
		p.skipSpace()
		if p.i >= len(p.in) {
			return false, errSyntax
		}
		if p.in[p.i] == ']' {
			p.i++
			break
		}
		if p.in[p.i] != ',' {
			return false, errSyntax
		}
		p.i++
		p.out = append(p.out, ',')
		p.skipSpace()
	}
	if pushed {
		s.path = s.path[:len(s.path)-1]
	}
	p.out = append(p.out, ']')
	return clean, nil
}

func (p *parser) object(depth int, live bool) (bool, error) {
	s := p.s
	oi := len(s.objects)
	s.objects = append(s.objects, object{start: p.pos()})
	p.i++ // '{'
	p.out = append(p.out, '{')
	base := len(s.stack)
	inOrder, clean := true, true
	written := 0
	p.skipSpace()
	if p.i < len(p.in) && p.in[p.i] == '}' {
		p.i++
	} else {
		for {
			if p.i >= len(p.in) || p.in[p.i] != '"' {
				return false, errSyntax
			}
			m, raw, escaped, err := p.name()
			if err != nil {
				return false, err
			}
			p.skipSpace()
			if p.i >= len(p.in) || p.in[p.i] != ':' {
				return false, errSyntax
			}
			p.i++
			p.skipSpace()

			name := p.nameBytes(&m)
			if n := len(s.stack); n > base && inOrder {
				prev := &s.stack[n-1]
				switch c := compareNames(p.nameBytes(prev), name); {
				case c == 0:
					return false, errDuplicate
				case c > 0:
					inOrder = false
				}
			}
			ignored, childLive := false, false
			if live {
				ignored, childLive = p.matchMember(name)
			}
			if childLive {
				s.path = append(s.path, name)
			}
			outMark, objMark, memMark := len(p.out), len(s.objects), len(s.members)
			if written > 0 && !ignored {
				p.out = append(p.out, ',')
			}
			m.start, m.obj = p.pos(), objMark
			if escaped {
				p.out, _ = appendUnescaped(p.out, raw, true) // valid: name unescaped it
			} else {
				p.out = append(p.out, '"')
				p.out = append(p.out, raw...)
				p.out = append(p.out, '"')
			}
			p.out = append(p.out, ':')
			c, err := p.value(depth+1, childLive)
			if err != nil {
				return false, err
			}
			if childLive {
				s.path = s.path[:len(s.path)-1]
			}
			if ignored {
				m.ignored = true
				p.out = p.out[:outMark]
				s.objects = s.objects[:objMark]
				s.members = s.members[:memMark]
			} else {
				written++
				clean = clean && c
			}
			m.end = p.pos()
			s.stack = append(s.stack, m)

			p.skipSpace()
			if p.i >= len(p.in) {
				return false, errSyntax
			}
			if p.in[p.i] == '}' {
				p.i++
				break
			}
			if p.in[p.i] != ',' {
				return false, errSyntax
			}
			p.i++
			p.skipSpace()
		}
	}
	p.out = append(p.out, '}')
	o := &s.objects[oi]
	o.end = p.pos()
	switch {
	case !inOrder:
		ms := s.stack[base:]
		slices.SortFunc(ms, func(a, b member) int {
			return compareNames(p.nameBytes(&a), p.nameBytes(&b))
		})
		o.mBase = len(s.members)
		for j := range ms {
			if j > 0 && compareNames(p.nameBytes(&ms[j-1]), p.nameBytes(&ms[j])) == 0 {
				return false, errDuplicate
			}
			if !ms[j].ignored {
				s.members = append(s.members, ms[j])
			}
		}
		o.mLen = len(s.members) - o.mBase
		o.state = objReorder
	case !clean:
		o.state = objInOrder
	}
	o.next = len(s.objects)
	s.stack = s.stack[:base]
	return inOrder && clean, nil
}

func (p *parser) nameBytes(m *member) []byte {
	if m.inArena {
		return p.s.arena[m.nameOff : m.nameOff+m.nameLen]
	}
	return p.in[m.nameOff : m.nameOff+m.nameLen]
}

// matchMember reports whether the member called name, inside the object at
// the current path, is ignored, and whether an ignore path continues below
// it.
func (p *parser) matchMember(name []byte) (ignored, live bool) {
	d := len(p.s.path)
	for _, ip := range p.ignore {
		if len(ip) > d && ip[d] == string(name) && p.prefixMatches(ip) {
			if len(ip) == d+1 {
				return true, false
			}
			live = true
		}
	}
	return false, live
}

// matchArray reports whether an ignore path continues through the elements
// of the array at the current path.
func (p *parser) matchArray() bool {
	d := len(p.s.path)
	for _, ip := range p.ignore {
		if len(ip) > d+1 && ip[d] == arrayComponent && p.prefixMatches(ip) {
			return true
		}
	}
	return false
}

func (p *parser) prefixMatches(ip []string) bool {
	for j, c := range p.s.path {
		if ip[j] != string(c) {
			return false
		}
	}
	return true
}

// compareNames orders member names by their UTF-16 code units (RFC 8785
// §3.2.3). Valid UTF-8 sorts bytewise in code point order, which differs
// from UTF-16 order only between U+E000–U+FFFF (lead byte 0xEE or 0xEF) and
// the supplementary planes (lead byte 0xF0–0xF4), whose surrogates sort
// below U+E000.
func compareNames(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x >= 0xEE && y >= 0xEE && (x >= 0xF0) != (y >= 0xF0) {
			if x >= 0xF0 {
				return -1
			}
			return 1
		}
		if x < y {
			return -1
		}
		return 1
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

// stringAction classifies a byte inside a string: 0 copy, 1 end of the
// string or escape, 2 control character (invalid), 3 non-ASCII.
var stringAction = func() (t [256]uint8) {
	for c := 0; c < 0x20; c++ {
		t[c] = 2
	}
	t['"'], t['\\'] = 1, 1
	for c := 0x80; c < 0x100; c++ {
		t[c] = 3
	}
	return t
}()

// scanString validates the string whose opening quote is at p.i and moves
// p.i past its closing quote. It returns the bytes between the quotes and
// whether they hold an escape. It checks UTF-8, refuses a literal U+FFFD,
// and checks the escape syntax; surrogate pairing is checked when the
// escapes are decoded.
func (p *parser) scanString() (raw []byte, escaped bool, err error) {
	in := p.in
	start := p.i + 1
	i := start
	for i < len(in) {
		switch stringAction[in[i]] {
		case 0:
			i++
		case 1:
			if in[i] == '"' {
				p.i = i + 1
				return in[start:i], escaped, nil
			}
			escaped = true
			if i+1 >= len(in) {
				return nil, false, errSyntax
			}
			switch in[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(in) {
					return nil, false, errSyntax
				}
				for _, h := range in[i+2 : i+6] {
					if hexValue(h) < 0 {
						return nil, false, errSyntax
					}
				}
				i += 6
			default:
				return nil, false, errSyntax
			}
		case 2:
			return nil, false, errSyntax
		default:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError {
				if size == 1 {
					return nil, false, errUTF8
				}
				return nil, false, errString
			}
			i += size
		}
	}
	return nil, false, errSyntax
}

func hexValue(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

func hex4(b []byte) rune {
	return rune(hexValue(b[0])<<12 | hexValue(b[1])<<8 | hexValue(b[2])<<4 | hexValue(b[3]))
}

func (p *parser) stringValue() error {
	raw, escaped, err := p.scanString()
	if err != nil {
		return err
	}
	if !escaped {
		p.out = append(p.out, '"')
		p.out = append(p.out, raw...)
		p.out = append(p.out, '"')
		return nil
	}
	out, err := appendUnescaped(p.out, raw, true)
	if err != nil {
		return err
	}
	p.out = out
	return nil
}

// name scans a member name. A name with escapes is unescaped into the
// arena, so that names compare by value.
func (p *parser) name() (m member, raw []byte, escaped bool, err error) {
	raw, escaped, err = p.scanString()
	if err != nil {
		return member{}, nil, false, err
	}
	if !escaped {
		return member{nameOff: p.i - 1 - len(raw), nameLen: len(raw)}, raw, false, nil
	}
	s := p.s
	off := len(s.arena)
	s.arena, err = appendUnescaped(s.arena, raw, false)
	if err != nil {
		return member{}, nil, false, err
	}
	return member{nameOff: off, nameLen: len(s.arena) - off, inArena: true}, raw, true, nil
}

// appendUnescaped decodes the escapes of raw, a string body that passed
// scanString. With quote set it appends the string in canonical form
// (RFC 8785 §3.2.2.2: quotes, and escapes only for '"', '\\' and control
// characters); otherwise it appends the decoded bytes. It refuses U+FFFD
// and any surrogate escape that is not a high surrogate followed by a low
// one.
func appendUnescaped(dst, raw []byte, quote bool) ([]byte, error) {
	if quote {
		dst = append(dst, '"')
	}
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			j := i + 1
			for j < len(raw) && raw[j] != '\\' {
				j++
			}
			dst = append(dst, raw[i:j]...)
			i = j
			continue
		}
		e := raw[i+1]
		i += 2
		var r rune
		switch e {
		case '"', '\\', '/':
			r = rune(e)
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		default: // 'u'
			r = hex4(raw[i:])
			i += 4
			if r >= 0xD800 && r < 0xE000 {
				if r >= 0xDC00 || i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
					return dst, errString
				}
				lo := hex4(raw[i+2:])
				if lo < 0xDC00 || lo >= 0xE000 {
					return dst, errString
				}
				r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				i += 6
			} else if r == utf8.RuneError {
				return dst, errString
			}
		}
		if quote {
			dst = appendRune(dst, r)
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	if quote {
		dst = append(dst, '"')
	}
	return dst, nil
}

const hexDigits = "0123456789abcdef"

// appendRune appends r as it appears inside a canonical string.
func appendRune(dst []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(dst, '\\', byte(r))
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if r < 0x20 {
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
	}
	return utf8.AppendRune(dst, r)
}

// number parses the number literal at p.i and appends its canonical form.
func (p *parser) number() error {
	in := p.in
	start := p.i
	i := start
	neg := false
	if in[i] == '-' {
		neg = true
		i++
	}
	// int = "0" / digit1-9 *DIGIT
	intStart := i
	if i >= len(in) {
		return errSyntax
	}
	switch {
	case in[i] == '0':
		i++
	case in[i] >= '1' && in[i] <= '9':
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
	default:
		return errSyntax
	}
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(in) && in[i] == '.' {
		i++
		fracStart = i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		if i == fracStart {
			return errSyntax
		}
		fracEnd = i
	}
	hasExp, expNeg, exp := false, false, 0
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		hasExp = true
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			expNeg = in[i] == '-'
			i++
		}
		expStart := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			if exp <= maxExponent {
				exp = exp*10 + int(in[i]-'0')
			}
			i++
		}
		if i == expStart {
			return errSyntax
		}
	}
	p.i = i
	lit := in[start:i]
	if len(lit) > maxNumberLength {
		return errNumber
	}
	if !hasExp && fracEnd == intEnd && intEnd-intStart <= 15 {
		// An integer of at most 15 digits is exact, and its canonical
		// form is itself, except that -0 is 0.
		if intEnd-intStart == 1 && in[intStart] == '0' {
			p.out = append(p.out, '0')
		} else {
			p.out = append(p.out, lit...)
		}
		return nil
	}
	if exp > maxExponent {
		return errNumber
	}
	if expNeg {
		exp = -exp
	}
	f, ok := exactValue(in[intStart:intEnd], in[fracStart:fracEnd], exp)
	if !ok {
		// More than 19 significant digits: decide with big.Rat.
		var exact bool
		f, exact = exactSlow(lit)
		if !exact {
			return errNumber
		}
	} else if math.IsNaN(f) {
		return errNumber
	}
	if neg {
		f = -f
	}
	p.out = appendNumber(p.out, f)
	return nil
}

// pow5 holds 5^0 … 5^27, every power of five below 10^19.
var pow5 = func() (t [28]uint64) {
	t[0] = 1
	for i := 1; i < len(t); i++ {
		t[i] = t[i-1] * 5
	}
	return t
}()

// exactValue decides whether the non-negative decimal intDigits.fracDigits
// × 10^exp is exactly a float64. It returns the value, or NaN when it is
// not exact; ok is false when there are too many significant digits to
// decide here.
func exactValue(intDigits, fracDigits []byte, exp int) (f float64, ok bool) {
	// Significant digits, without leading and trailing zeros; the value
	// is mant × 10^e.
	var mant uint64
	nd, e := 0, exp-len(fracDigits)
	zeros := 0 // pending zeros, written only if a non-zero digit follows
	for k := 0; k < len(intDigits)+len(fracDigits); k++ {
		var c byte
		if k < len(intDigits) {
			c = intDigits[k]
		} else {
			c = fracDigits[k-len(intDigits)]
		}
		d := uint64(c - '0')
		if d == 0 {
			if nd > 0 {
				zeros++
			}
			continue
		}
		if nd+zeros+1 > 19 {
			return 0, false
		}
		for ; zeros > 0; zeros-- {
			mant *= 10
			nd++
		}
		mant = mant*10 + d
		nd++
	}
	if nd == 0 {
		return 0, true
	}
	e += zeros // trailing zeros
	if e < 0 {
		// mant × 10^e is a dyadic rational only if 5^-e divides mant.
		if -e >= len(pow5) || mant%pow5[-e] != 0 {
			return math.NaN(), true
		}
		mant /= pow5[-e]
	} else {
		// mant × 5^e must stay within 53 bits once its factors of two
		// are taken out.
		tz := bits.TrailingZeros64(mant)
		odd := mant >> tz
		for k := 0; k < e; k++ {
			if odd > (1<<53)/5 {
				return math.NaN(), true
			}
			odd *= 5
		}
		if odd >= 1<<53 {
			return math.NaN(), true
		}
		if tz+e+bits.Len64(odd) > 1024 {
			return math.NaN(), true // beyond the float64 range
		}
		return math.Ldexp(float64(odd), tz+e), true
	}
	// The value is mant × 2^e with -27 <= e < 0: far from the subnormals.
	tz := bits.TrailingZeros64(mant)
	odd := mant >> tz
	if odd >= 1<<53 {
		return math.NaN(), true
	}
	return math.Ldexp(float64(odd), tz+e), true
}

// exactSlow decides with big.Rat whether the number literal lit is exactly
// a float64, as idem.CanonicalJSON does.
func exactSlow(lit []byte) (float64, bool) {
	s := string(lit)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return 0, false
	}
	var exact big.Rat
	exact.SetFloat64(f)
	if r.Cmp(&exact) != 0 {
		return 0, false
	}
	return math.Abs(f), true
}

// appendNumber appends f in the ECMAScript Number-to-String form RFC 8785
// §3.2.2.3 prescribes, byte for byte as jcs.NumberToJSON writes it.
func appendNumber(dst []byte, f float64) []byte {
	if f == 0 {
		return append(dst, '0')
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	if f < 1e21 && f >= 1e-6 {
		return strconv.AppendFloat(dst, f, 'f', -1, 64)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'e', -1, 64)
	// Go writes at least two exponent digits ("1e+21", "1e-07"); ECMAScript
	// writes no leading zero.
	for i := start; i < len(dst); i++ {
		if dst[i] == 'e' {
			if dst[i+2] == '0' {
				dst = append(dst[:i+2], dst[i+3:]...)
			}
			break
		}
	}
	return dst
}
