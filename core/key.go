package idem

import (
	"errors"
	"fmt"
)

// DefaultMaxKeyLength is the longest key accepted unless Config says otherwise.
const DefaultMaxKeyLength = 255

// Key parsing errors. ParseKey wraps them with the reason.
var (
	// ErrKeyMissing means the request carried no idempotency key.
	ErrKeyMissing = errors.New("idem: idempotency key missing")
	// ErrKeyInvalid means the key header could not be parsed or is not
	// 1 to max visible ASCII characters.
	ErrKeyInvalid = errors.New("idem: idempotency key invalid")
)

// ParseKey parses the value of an Idempotency-Key header. It accepts the
// Structured Field string form of RFC 9651 ("abc", with \" and \\ escapes)
// and the bare form (abc) that most clients send; both name the key abc.
// Optional white space around the value is ignored. The key must be 1 to
// maxLen visible ASCII characters (0x21–0x7E); maxLen <= 0 means
// DefaultMaxKeyLength. Only an empty raw value (no header) returns
// ErrKeyMissing; anything else that is not a key, including a value of only
// white space or the empty string "", returns an error wrapping
// ErrKeyInvalid: with Config.KeyOptional, a blank key must not let the
// request run without deduplication.
func ParseKey(raw string, maxLen int) (string, error) {
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
				return "", fmt.Errorf("%w: characters after the closing quote", ErrKeyInvalid)
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

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// blankKey is Request.Key for a key header that is present with an empty
// value (net/http drops the white space around a field value, so "   "
// arrives as ""): ParseKey reads it as blank, not as missing.
const blankKey = " "
