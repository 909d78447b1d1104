package idem

import (
	"fmt"
)

// parseKey parses the value of an Idempotency-Key header. The field is one
// RFC 9651 Structured Field Item, a string ("abc", with \" and \\ escapes,
// which may hold , and ; between the quotes: "a,b" is the key a,b); parseKey
// also accepts the bare form (abc) that most clients send, naming the same
// key. Optional white space around the value is ignored. The key must be 1
// to maxLen visible ASCII characters (0x21–0x7E); maxLen <= 0 means
// DefaultMaxKeyLength.
//
// An ambiguous value is refused, so that no reading of it picks one key and
// runs the request: a list ("a", "b" or a, b, which is also what several
// field lines combine into, see idemadapter.KeyField), an Inner List (("a" "b")), or
// parameters ("a";x=1, a;x). So a bare key cannot contain , or ; nor start
// with (; send such a key quoted.
//
// Only an empty raw value (no header) returns ErrKeyMissing; anything else
// that is not a key, including a value of only white space or the empty
// string "", returns an error wrapping ErrKeyInvalid with the reason: with
// Config.KeyOptional, a blank key must not let the request run without
// deduplication.
func parseKey(raw string, maxLen int) (string, error) {
	if maxLen <= 0 {
		maxLen = DefaultMaxKeyLength
	}
	if raw == "" {
		return "", ErrKeyMissing
	}
	raw = trimOWS(raw)
	if raw == "" {
		return "", fmt.Errorf("%w: blank", ErrKeyInvalid)
	}
	key := raw
	if raw[0] == '"' {
		var err error
		if key, err = parseSFString(raw); err != nil {
			return "", err
		}
	} else if err := checkBare(raw); err != nil {
		return "", err
	}
	if len(key) == 0 {
		return "", fmt.Errorf("%w: empty", ErrKeyInvalid)
	}
	if len(key) > maxLen {
		return "", fmt.Errorf("%w: longer than %d characters", ErrKeyInvalid, maxLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("%w: character %d is not visible ASCII", ErrKeyInvalid, i+1)
		}
	}
	return key, nil
}

// parseSFString parses a complete RFC 9651 sf-string: a double quote,
// printable ASCII with \" and \\ as the only escapes, a closing quote, and
// nothing after it. It returns the unescaped content without allocating when
// there is no escape.
func parseSFString(s string) (string, error) {
	var buf []byte // nil until the first escape
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i >= len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape in quoted key", ErrKeyInvalid)
			}
			if buf == nil {
				buf = append(make([]byte, 0, len(s)), s[1:i-1]...)
			}
			buf = append(buf, s[i])
		case c == '"':
			if i != len(s)-1 {
				return "", afterString(trimOWS(s[i+1:]))
			}
			if buf == nil {
				return s[1:i], nil
			}
			return string(buf), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: character outside printable ASCII in quoted key", ErrKeyInvalid)
		default:
			if buf != nil {
				buf = append(buf, c)
			}
		}
	}
	return "", fmt.Errorf("%w: missing closing quote", ErrKeyInvalid)
}

// afterString returns the error for rest, what follows the closing quote
// of a key (without the white space after the quote).
func afterString(rest string) error {
	switch rest[0] {
	case ',':
		return errKeyList
	case ';':
		return errKeyParams
	}
	return fmt.Errorf("%w: characters after the closing quote", ErrKeyInvalid)
}

// checkBare refuses a bare key that a Structured Field parser would read as
// more than one key, as an Inner List, or as a key with parameters.
func checkBare(key string) error {
	if key[0] == '(' {
		return errKeyInnerList
	}
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case ',':
			return errKeyList
		case ';':
			return errKeyParams
		}
	}
	return nil
}

// The reasons for refusing an ambiguous key.
var (
	errKeyList      = fmt.Errorf("%w: a list of keys (several field lines, or a comma outside quotes)", ErrKeyInvalid)
	errKeyInnerList = fmt.Errorf("%w: an Inner List (a parenthesis outside quotes)", ErrKeyInvalid)
	errKeyParams    = fmt.Errorf("%w: parameters after the key (a semicolon outside quotes)", ErrKeyInvalid)
)

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
