// Package wire holds what the engine and the adapters both do to an HTTP
// request or response: read a body within a limit, check header fields,
// combine key field lines, write a stored response. Package idemadapter
// documents and exports it for adapter authors.
package wire

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemgo/idem/core/idemstore"
)

// ContextKey is idemadapter.ContextKey.
const ContextKey = "github.com/idemgo/idem/core.AttemptContext"

// ErrBodyTooLarge is returned when a request body exceeds the read limit.
var ErrBodyTooLarge = errors.New("idem: request body too large")

// ReadBody reads r up to limit bytes. It returns ErrBodyTooLarge when r holds
// more than limit bytes; the bytes read so far are then discarded.
func ReadBody(r io.Reader, limit int64) ([]byte, error) {
	return ReadBodyHint(r, limit, -1)
}

// maxBodyHint caps what a declared Content-Length may reserve before its
// bytes arrive: past it the buffer grows with what is read. A client that
// declares 1 MiB and sends 1 byte costs at most this much, not 1 MiB
// (TestSlowBodyFloodHeap holds 400 such connections to a small heap).
const maxBodyHint = 16 << 10

// ReadBodyHint is ReadBody with a size hint: a declared Content-Length within
// the limit and within maxBodyHint sizes the buffer exactly, so a
// well-formed small request is read with one allocation. A larger
// declaration reserves maxBodyHint and the buffer grows as bytes arrive.
// The hint is never trusted for the limit itself.
func ReadBodyHint(r io.Reader, limit, hint int64) ([]byte, error) {
	if r == nil || r == http.NoBody {
		return nil, nil
	}
	size := int64(512)
	if hint >= 0 && hint <= limit {
		size = min(hint+1, maxBodyHint) // +1 lets the read see EOF without growing
	}
	buf := make([]byte, 0, size)
	for {
		if int64(len(buf)) > limit {
			return nil, ErrBodyTooLarge
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):min(int64(cap(buf)), limit+1)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			if int64(len(buf)) > limit {
				return nil, ErrBodyTooLarge
			}
			return buf, nil
		}
		if err != nil {
			return nil, fmt.Errorf("idem: read request body: %w", err)
		}
	}
}

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

// CheckHeader returns an error naming the first field of h whose name or
// value is not valid HTTP, or nil.
func CheckHeader(h http.Header) error {
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
func ValidHeaderField(name string, values []string) bool {
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

// KeyField returns what an adapter passes as Request.Key (or Call.Key) for
// the values of the key header as the request carried them, one per field
// line (http.Header.Values, gRPC metadata's Get): "" when there is none;
// the value itself when there is one, or " " when that value is empty, so
// that a header sent empty is refused as blank, not read as missing; and
// several joined with ", ", as RFC 9110 §5.3 combines field lines, into the
// list that ParseKey refuses as ambiguous.
func KeyField(lines []string) string {
	switch len(lines) {
	case 0:
		return ""
	case 1:
		if lines[0] == "" {
			return blankKey
		}
		return lines[0]
	}
	return strings.Join(lines, ", ")
}

// blankKey is Request.Key for a key header that is present with an empty
// value (net/http drops the white space around a field value, so "   "
// arrives as ""): ParseKey reads it as blank, not as missing.
const blankKey = " "

// ErrStreaming is what http.ResponseController's Flush returns on an
// idempotent route: a streamed response cannot be stored and replayed, and
// nothing may reach the client before the commit.
var ErrStreaming = errors.New("idem: streaming is not supported on an idempotent route: the response is sent whole after the commit")

// WriteResponse writes resp to w: its headers (replacing those of the same
// name already set), a Content-Length, the status and the body. A header
// whose name or value is not valid HTTP (see ValidHeaderFieldValue) is left
// out: Finish refuses to store one, and this guards the replay of records
// stored before it did.
func WriteResponse(w http.ResponseWriter, resp *idemstore.Response) {
	h := w.Header()
	for k, v := range resp.Header {
		// A record stored before values were checked may hold one that
		// would split the response: it is left out.
		if !ValidHeaderField(k, v) {
			continue
		}
		h[k] = v
	}
	h.Del("Transfer-Encoding")
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body)
	}
}
