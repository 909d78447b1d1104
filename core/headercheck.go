package idem

import (
	"fmt"
	"net/http"
)

// ValidHeaderFieldName reports whether name is an RFC 9110 field name: one
// or more token characters. It mirrors
// golang.org/x/net/http/httpguts.ValidHeaderFieldName, written out to keep
// core free of dependencies.
func ValidHeaderFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !isTokenByte(name[i]) {
			return false
		}
	}
	return true
}

// ValidHeaderFieldValue reports whether value may be sent as a field value:
// no control character but horizontal tab, no DEL. Obsolete text (bytes
// 0x80 and above) is allowed, as httpguts.ValidHeaderFieldValue allows it.
// A value that fails it could split the response (CR, LF) or be cut short
// (NUL) by a server that writes values raw.
func ValidHeaderFieldValue(value string) bool {
	for i := 0; i < len(value); i++ {
		if b := value[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

// isTokenByte reports whether b is an RFC 9110 tchar.
func isTokenByte(b byte) bool {
	switch {
	case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9':
		return true
	}
	switch b {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// checkHeader returns an error naming the first field of h whose name or
// value is not valid HTTP, or nil.
func checkHeader(h http.Header) error {
	for k, vs := range h {
		if !ValidHeaderFieldName(k) {
			return fmt.Errorf("header name %q is not a valid field name", k)
		}
		for _, v := range vs {
			if !ValidHeaderFieldValue(v) {
				return fmt.Errorf("header %s has a value with a control character", k)
			}
		}
	}
	return nil
}

// ValidHeaderField reports whether a header field may be written as it is:
// name is a field name and every value a field value. Adapters that write
// a replayed response's headers themselves (not through WriteResponse)
// leave out a field that fails it, as WriteResponse does: Finish refuses to
// store one, and this guards the replay of records stored before it did,
// on servers that write values raw (fasthttp).
func ValidHeaderField(name string, values []string) bool { return validField(name, values) }

func validField(name string, values []string) bool {
	if !ValidHeaderFieldName(name) {
		return false
	}
	for _, v := range values {
		if !ValidHeaderFieldValue(v) {
			return false
		}
	}
	return true
}
