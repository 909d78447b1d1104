package idemstore

import (
	"strings"
	"unicode/utf8"
)

// The limits every store holds. They are the same on every store and
// dialect, so a request that one store accepts every store accepts: the
// narrowest index (MySQL/MariaDB InnoDB, 3072 bytes for the primary key)
// holds a principal and a key of these lengths with room to spare.
const (
	// FingerprintSize is the length of the fingerprint a record holds
	// (Record.Fingerprint, ClaimRequest.Fingerprint): a version byte and a
	// 32-byte HMAC-SHA-256. Stores size their column for it.
	FingerprintSize = 1 + 32
	// MaxPrincipalLength is the longest principal, in bytes, that an
	// idempotent request may carry. A longer one, or one that is not valid
	// UTF-8 or contains a NUL byte, is answered with a 400
	// principal-invalid problem and nothing is claimed.
	MaxPrincipalLength = 255
	// MaxKeyLengthLimit is the largest value Config.MaxKeyLength may take.
	MaxKeyLengthLimit = 255
	// MaxRequestIDLength bounds the request id stored with a record, in
	// bytes. A longer id is cut at a character boundary; invalid UTF-8 and
	// NUL bytes are replaced, so every store keeps it as it is.
	MaxRequestIDLength = 255
)

// BoundRequestID returns id as every store can keep it: valid UTF-8 without
// NUL bytes (each replaced by U+FFFD), cut at a character boundary to at
// most MaxRequestIDLength bytes. The engine bounds every request id it
// claims with; stores apply it too, for callers of Store.Claim.
func BoundRequestID(id string) string {
	if !utf8.ValidString(id) {
		id = strings.ToValidUTF8(id, "\uFFFD")
	}
	if strings.IndexByte(id, 0) >= 0 {
		id = strings.ReplaceAll(id, "\x00", "\uFFFD")
	}
	if len(id) <= MaxRequestIDLength {
		return id
	}
	cut := MaxRequestIDLength
	for cut > 0 && !utf8.RuneStart(id[cut]) {
		cut--
	}
	return id[:cut]
}
