package jsoncanon

// referenceCanonical is a verbatim copy of idem.CanonicalJSON as of commit
// f2348da (core/fingerprint.go), the slow implementation Append replaces.
// The differential tests hold Append to it: same decision, same bytes.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

const refMaxJSONDepth = 128

const refMaxExactNumberLength = 32

var errRefNotCanonical = errors.New("idem: JSON cannot be canonicalised without losing information")

func referenceCanonical(body []byte, ignore []string) ([]byte, error) {
	if !utf8.Valid(body) {
		return nil, fmt.Errorf("%w: invalid UTF-8", errRefNotCanonical)
	}
	c := refCanonicaliser{dec: json.NewDecoder(bytes.NewReader(body))}
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
		return nil, fmt.Errorf("%w: data after the JSON value", errRefNotCanonical)
	}
	return jcs.Transform(c.out.Bytes())
}

type refCanonicaliser struct {
	dec    *json.Decoder
	ignore [][]string
	out    bytes.Buffer
	path   []string
}

func (c *refCanonicaliser) value(depth int, tok json.Token, w *bytes.Buffer) error {
	if depth > refMaxJSONDepth {
		return fmt.Errorf("%w: nested deeper than %d", errRefNotCanonical, refMaxJSONDepth)
	}
	if tok == nil {
		var err error
		if tok, err = c.dec.Token(); err != nil {
			return fmt.Errorf("%w: %v", errRefNotCanonical, err)
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
		return fmt.Errorf("%w: unexpected %q", errRefNotCanonical, v)
	case string:
		return c.writeJSONString(w, v)
	case json.Number:
		if !refExactDouble(string(v)) {
			return fmt.Errorf("%w: number %.40q is not an exact double", errRefNotCanonical, string(v))
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

func (c *refCanonicaliser) object(depth int, w *bytes.Buffer) error {
	seen := make(map[string]struct{})
	if w != nil {
		w.WriteByte('{')
	}
	first := true
	for c.dec.More() {
		tok, err := c.dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %v", errRefNotCanonical, err)
		}
		name, _ := tok.(string)
		if _, dup := seen[name]; dup {
			return fmt.Errorf("%w: duplicate member %.40q", errRefNotCanonical, name)
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
		return fmt.Errorf("%w: %v", errRefNotCanonical, err)
	}
	if w != nil {
		w.WriteByte('}')
	}
	return nil
}

func (c *refCanonicaliser) array(depth int, w *bytes.Buffer) error {
	if w != nil {
		w.WriteByte('[')
	}
	for i := 0; c.dec.More(); i++ {
		if w != nil && i > 0 {
			w.WriteByte(',')
		}
		saved := c.path
		c.path = append(c.path, "\x00[]")
		err := c.value(depth+1, nil, w)
		c.path = saved
		if err != nil {
			return err
		}
	}
	if _, err := c.dec.Token(); err != nil { // ']'
		return fmt.Errorf("%w: %v", errRefNotCanonical, err)
	}
	if w != nil {
		w.WriteByte(']')
	}
	return nil
}

func (c *refCanonicaliser) ignored() bool {
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

func (c *refCanonicaliser) writeJSONString(w *bytes.Buffer, s string) error {
	if strings.ContainsRune(s, utf8.RuneError) {
		return fmt.Errorf("%w: U+FFFD or a lone surrogate in a string", errRefNotCanonical)
	}
	if w == nil {
		return nil
	}
	b, _ := json.Marshal(s)
	w.Write(b)
	return nil
}

func refExactDouble(s string) bool {
	if len(s) > refMaxExactNumberLength {
		return false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return false
	}
	if refIsSmallInteger(s) {
		return true
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
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

func refIsSmallInteger(s string) bool {
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
