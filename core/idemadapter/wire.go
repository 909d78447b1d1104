package idemadapter

import (
	"context"
	"io"
	"net/http"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/internal/hooks"
	"github.com/idemgo/idem/core/internal/wire"
)

// ErrBodyTooLarge is returned by ReadBody, and wrapped by the Event's Err of
// a request answered 413 body-too-large, when a request body exceeds the
// read limit.
var ErrBodyTooLarge = wire.ErrBodyTooLarge

// ReadBody reads r up to limit bytes, as the engine reads a request body. It
// returns ErrBodyTooLarge when r holds more than limit bytes; the bytes
// read so far are then discarded. Adapters whose framework hands them the
// body as a reader use it to fill Request.Body's bytes themselves.
func ReadBody(r io.Reader, limit int64) ([]byte, error) { return wire.ReadBody(r, limit) }

// ErrStreaming is what http.ResponseController's Flush returns on an
// idempotent route (ResponseBuffer.FlushError): a streamed response cannot
// be stored and replayed, and nothing may reach the client before the
// commit.
var ErrStreaming = wire.ErrStreaming

// WriteResponse writes resp to w: its headers (replacing those of the same
// name already set), a Content-Length, the status and the body. A header
// whose name or value is not valid HTTP (see ValidHeaderField) is left out:
// Finish refuses to store one, and this guards the replay of records stored
// before it did.
func WriteResponse(w http.ResponseWriter, resp *idem.Response) { wire.WriteResponse(w, resp) }

// KeyField returns what an adapter passes as Request.Key (or Call.Key) for
// the values of the key header as the request carried them, one per field
// line (http.Header.Values, gRPC metadata's Get): "" when there is none;
// the value itself when there is one, or " " when that value is empty, so
// that a header sent empty is refused as blank, not read as missing; and
// several joined with ", ", as RFC 9110 section 5.3 combines field lines,
// into a list that Begin refuses as ambiguous.
func KeyField(lines []string) string { return wire.KeyField(lines) }

// ValidHeaderFieldName reports whether name is an RFC 9110 field name: one
// or more token characters, as golang.org/x/net/http/httpguts checks it.
func ValidHeaderFieldName(name string) bool { return wire.ValidHeaderFieldName(name) }

// ValidHeaderFieldValue reports whether value may be sent as a field value:
// no control character but horizontal tab, no DEL. Obsolete text (bytes
// 0x80 and above) is allowed, as httpguts.ValidHeaderFieldValue allows it.
// A value that fails it could split the response (CR, LF) or be cut short
// (NUL) by a server that writes values raw.
func ValidHeaderFieldValue(value string) bool { return wire.ValidHeaderFieldValue(value) }

// ValidHeaderField reports whether a header field may be written as it is:
// name is a field name and every value a field value. Adapters that write
// a replayed response's headers themselves (not through WriteResponse)
// leave out a field that fails it, as WriteResponse does: Finish refuses to
// store one, and this guards the replay of records stored before it did,
// on servers that write values raw (fasthttp).
func ValidHeaderField(name string, values []string) bool { return wire.ValidHeaderField(name, values) }

// FingerprintVersion is the first byte of every fingerprint the engine
// stores: it names the construction (HMAC-SHA-256 of the
// "idem/fingerprint/v2" input), so a stored fingerprint says how it was made
// and a future construction can be told apart from it. Every value
// Fingerprint returns starts with it.
const FingerprintVersion byte = 2

// Fingerprint returns the fingerprint of a request under key: its method,
// path (with query), principal and body, MACed with HMAC-SHA-256 under key
// and prefixed with FingerprintVersion (idemstore.FingerprintSize bytes). The key is
// what protects the request's fields: whoever reads a stored fingerprint
// without the key learns nothing about them, not even by trying every
// value of a small field (an amount, a CVV), while whoever holds the key
// can test guesses at the speed of HMAC. Keep it as secret as the database
// credentials, and the same on every instance that shares a store.
//
// When contentType names JSON (application/json or any +json type) and the
// body is valid I-JSON, the body enters the MAC in its RFC 8785 canonical
// form with the ignore paths removed, so key order, insignificant white
// space and number spelling do not matter. Any other body, including JSON
// that cannot be canonicalised without losing information (duplicate
// members, invalid UTF-8, numbers that are not exact doubles, nesting past
// 128 levels), enters byte for byte. The two forms are domain-separated and
// never collide.
//
// Each ignore path names an object member to leave out: "sent_at" at the
// top level, "meta.sent_at" inside nested objects.
//
// Adapters and stores need it only in tests, to build the fingerprint of a
// request they send.
func Fingerprint(key []byte, method, path, principal, contentType string, body []byte, ignore []string) []byte {
	return hooks.Fingerprint(key, method, path, principal, contentType, body, ignore)
}

// ContextKey is the key, a string, under which an adapter stores the
// attempt's context in a framework context that does not pass the
// request's values through: gin's *gin.Context answers Value for a string
// key from its own keys (c.Set), and for any other key only when the Gin
// engine's ContextWithFallback is set. With it, the stores' accessors
// (idempgx.Tx, idemgorm.DB, idemredis.Tx, memstore.Tx), idemadapter.LeaseFrom and
// idem.DownstreamKey find the attempt whichever context the handler passes: the
// request's, or the framework's own.
const ContextKey = wire.ContextKey

// LeaseFrom returns the lease of the attempt running with ctx (the
// request's context, or a framework context carrying it under
// ContextKey), if any.
func LeaseFrom(ctx context.Context) (idemstore.Lease, bool) { return hooks.LeaseFrom(ctx) }
