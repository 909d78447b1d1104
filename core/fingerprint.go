package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// DefaultMaxBodyBytes is the largest request body fingerprinted unless
// Config says otherwise.
const DefaultMaxBodyBytes = 1 << 20

// maxJSONDepth bounds the nesting the canonicaliser follows. A deeper
// document is fingerprinted byte for byte instead.
const maxJSONDepth = 128

// maxExactNumberLength bounds the length of a number literal that is checked
// for an exact float64 value. Longer literals make the body fall back to
// byte-for-byte fingerprinting, which is always safe.
const maxExactNumberLength = 32

// ErrBodyTooLarge is returned when a request body exceeds the read limit.
var ErrBodyTooLarge = errors.New("idem: request body too large")

// errNotCanonical marks JSON that CanonicalJSON declines to canonicalise;
// such a body is fingerprinted byte for byte.
var errNotCanonical = errors.New("idem: JSON cannot be canonicalised without losing information")

// ReadBody reads r up to limit bytes. It returns ErrBodyTooLarge when r holds
// more than limit bytes; the bytes read so far are then discarded.
func ReadBody(r io.Reader, limit int64) ([]byte, error) {
	if r == nil || r == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("idem: read request body: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, ErrBodyTooLarge
	}
	return body, nil
}

// Fingerprint returns the SHA-256 fingerprint of a request: its method,
// path (with query), principal and body. When contentType names JSON
// (application/json or any +json type) and the body is valid I-JSON, the
// body enters the hash in its RFC 8785 canonical form with the ignore paths
// removed, so key order, insignificant white space and number spelling do
// not matter. Any other body, including JSON that cannot be canonicalised
// without losing information (duplicate members, invalid UTF-8, numbers
// that are not exact doubles, nesting past 128 levels), enters byte for
// byte. The two forms are domain-separated and never collide.
//
// Each ignore path names an object member to leave out: "sent_at" at the
// top level, "meta.sent_at" inside nested objects.
func Fingerprint(method, path, principal, contentType string, body []byte, ignore []string) []byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	writeField := func(mode byte, b []byte) {
		h.Write([]byte{mode})
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
		h.Write(b)
	}
	h.Write([]byte("idem/fingerprint/v1"))
	writeField('m', []byte(method))
	writeField('p', []byte(path))
	writeField('u', []byte(principal))
	if isJSONContentType(contentType) {
		if canon, err := CanonicalJSON(body, ignore); err == nil {
			writeField('j', canon)
			return h.Sum(nil)
		}
	}
	writeField('r', body)
	return h.Sum(nil)
}

func isJSONContentType(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// CanonicalJSON returns the RFC 8785 canonical form of body with the members
// named by ignore removed (see Fingerprint for the path syntax). It returns an
// error for invalid JSON and for JSON whose canonical form would lose
// information: duplicate object members, invalid UTF-8, nesting deeper than
// 128 levels, or a number that is not exactly a float64 (RFC 8785 numbers are
// IEEE doubles, so 9007199254740993 would silently become ...992 and two
// different amounts would share a fingerprint).
func CanonicalJSON(body []byte, ignore []string) ([]byte, error) {
	if !utf8.Valid(body) {
		return nil, fmt.Errorf("%w: invalid UTF-8", errNotCanonical)
	}
	c := canonicaliser{dec: json.NewDecoder(bytes.NewReader(body))}
	c.dec.UseNumber()
	for _, p := range ignore {
		if p != "" {
			c.ignore = append(c.ignore, strings.Split(p, "."))
		}
	}
	c.out.Grow(len(body))
	if err := c.value(0, nil, &c.out); err != nil {
		return nil, err
	}
	if _, err := c.dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON value", errNotCanonical)
	}
	return jcs.Transform(c.out.Bytes())
}

type canonicaliser struct {
	dec    *json.Decoder
	ignore [][]string
	out    bytes.Buffer
	path   []string
}

// value copies one JSON value from the decoder to w in compact form,
// dropping ignored members; w is nil while skipping an ignored value.
func (c *canonicaliser) value(depth int, tok json.Token, w *bytes.Buffer) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("%w: nested deeper than %d", errNotCanonical, maxJSONDepth)
	}
	if tok == nil {
		var err error
		if tok, err = c.dec.Token(); err != nil {
			return fmt.Errorf("%w: %v", errNotCanonical, err)
		}
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			return c.object(depth, w)
		case '[':
			return c.array(depth, w)
		}
		return fmt.Errorf("%w: unexpected %q", errNotCanonical, v)
	case string:
		return c.writeJSONString(w, v)
	case json.Number:
		if !exactDouble(string(v)) {
			return fmt.Errorf("%w: number %.40q is not an exact double", errNotCanonical, string(v))
		}
		if w != nil {
			w.WriteString(string(v))
		}
	case bool:
		if w != nil {
			w.WriteString(strconv.FormatBool(v))
		}
	case nil:
		if w != nil {
			w.WriteString("null")
		}
	}
	return nil
}

func (c *canonicaliser) object(depth int, w *bytes.Buffer) error {
	seen := make(map[string]struct{})
	if w != nil {
		w.WriteByte('{')
	}
	first := true
	for c.dec.More() {
		tok, err := c.dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %v", errNotCanonical, err)
		}
		name, _ := tok.(string)
		if _, dup := seen[name]; dup {
			return fmt.Errorf("%w: duplicate member %.40q", errNotCanonical, name)
		}
		seen[name] = struct{}{}
		c.path = append(c.path, name)
		mw := w
		if w != nil && c.ignored() {
			mw = nil
		}
		if mw != nil {
			if !first {
				w.WriteByte(',')
			}
			first = false
		}
		if err := c.writeJSONString(mw, name); err != nil {
			return err
		}
		if mw != nil {
			w.WriteByte(':')
		}
		err = c.value(depth+1, nil, mw)
		c.path = c.path[:len(c.path)-1]
		if err != nil {
			return err
		}
	}
	if _, err := c.dec.Token(); err != nil { // '}'
		return fmt.Errorf("%w: %v", errNotCanonical, err)
	}
	if w != nil {
		w.WriteByte('}')
	}
	return nil
}

func (c *canonicaliser) array(depth int, w *bytes.Buffer) error {
	if w != nil {
		w.WriteByte('[')
	}
	for i := 0; c.dec.More(); i++ {
		if w != nil && i > 0 {
			w.WriteByte(',')
		}
		// Array elements are not addressable by ignore paths: a path
		// continues only through objects.
		saved := c.path
		c.path = append(c.path, "\x00[]")
		err := c.value(depth+1, nil, w)
		c.path = saved
		if err != nil {
			return err
		}
	}
	if _, err := c.dec.Token(); err != nil { // ']'
		return fmt.Errorf("%w: %v", errNotCanonical, err)
	}
	if w != nil {
		w.WriteByte(']')
	}
	return nil
}

func (c *canonicaliser) ignored() bool {
	for _, p := range c.ignore {
		if len(p) != len(c.path) {
			continue
		}
		match := true
		for i := range p {
			if p[i] != c.path[i] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// writeJSONString writes s as a JSON string. It refuses strings holding
// U+FFFD: encoding/json decodes a lone surrogate escape ("\ud800") to it,
// so "\ud800" and "\ud801" would otherwise share a canonical form.
func (c *canonicaliser) writeJSONString(w *bytes.Buffer, s string) error {
	if strings.ContainsRune(s, utf8.RuneError) {
		return fmt.Errorf("%w: U+FFFD or a lone surrogate in a string", errNotCanonical)
	}
	if w == nil {
		return nil
	}
	b, _ := json.Marshal(s) // a valid UTF-8 string always marshals
	w.Write(b)
	return nil
}

// exactDouble reports whether the JSON number literal s denotes exactly the
// value of the nearest float64, so that RFC 8785's double-based form loses
// nothing.
func exactDouble(s string) bool {
	if len(s) > maxExactNumberLength {
		return false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil { // out of range
		return false
	}
	if isSmallInteger(s) {
		return true
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		// big.Rat would build 10^exp: refuse exponents no short exact
		// literal needs, so a hostile "1e-999999" costs nothing.
		if exp, err := strconv.Atoi(s[i+1:]); err != nil || exp > 400 || exp < -400 {
			return false
		}
	}
	lit, ok := new(big.Rat).SetString(s)
	if !ok {
		return false
	}
	var exact big.Rat
	exact.SetFloat64(f)
	return lit.Cmp(&exact) == 0
}

// isSmallInteger reports whether s is an integer literal of at most 15
// digits, which every float64 holds exactly.
func isSmallInteger(s string) bool {
	if s != "" && s[0] == '-' {
		s = s[1:]
	}
	if len(s) == 0 || len(s) > 15 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
