package idem

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/idemgo/idem/core/internal/jsoncanon"
)

// DefaultMaxBodyBytes is the largest request body fingerprinted unless
// Config says otherwise.
const DefaultMaxBodyBytes = 1 << 20

// ErrBodyTooLarge is returned when a request body exceeds the read limit.
var ErrBodyTooLarge = errors.New("idem: request body too large")

// ReadBody reads r up to limit bytes. It returns ErrBodyTooLarge when r holds
// more than limit bytes; the bytes read so far are then discarded.
func ReadBody(r io.Reader, limit int64) ([]byte, error) {
	return readBody(r, limit, -1)
}

// maxBodyHint caps what a declared Content-Length may reserve before its
// bytes arrive: past it the buffer grows with what is read. A client that
// declares 1 MiB and sends 1 byte costs at most this much, not 1 MiB
// (TestSlowBodyFloodHeap holds 400 such connections to a small heap).
const maxBodyHint = 16 << 10

// readBody is ReadBody with a size hint: a declared Content-Length within
// the limit and within maxBodyHint sizes the buffer exactly, so a
// well-formed small request is read with one allocation. A larger
// declaration reserves maxBodyHint and the buffer grows as bytes arrive.
// The hint is never trusted for the limit itself.
func readBody(r io.Reader, limit, hint int64) ([]byte, error) {
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

// The fingerprint's input format is versioned by its "idem/fingerprint/v2"
// prefix and the stored value by its first byte, FingerprintVersion:
// changing either changes every fingerprint, so in-flight retries across an
// upgrade would get 422. Bump both, never edit them in place. (v1 was an
// unkeyed SHA-256 of the same input, 32 bytes with no version byte.)

// FingerprintVersion is the first byte of every fingerprint: it names the
// construction (HMAC-SHA-256 of the "idem/fingerprint/v2" input), so a
// stored fingerprint says how it was made and a future construction can be
// told apart from it.
const FingerprintVersion byte = 2

// FingerprintSize is the length of a fingerprint: the version byte and a
// 32-byte HMAC-SHA-256.
const FingerprintSize = 1 + sha256.Size

// MinFingerprintKeyBytes is the shortest Config.FingerprintKey New accepts:
// 32 bytes, the strength of HMAC-SHA-256 itself.
const MinFingerprintKeyBytes = 32

// Fingerprint returns the fingerprint of a request under key: its method,
// path (with query), principal and body, MACed with HMAC-SHA-256 under key
// and prefixed with FingerprintVersion (FingerprintSize bytes). The key is
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
func Fingerprint(key []byte, method, path, principal, contentType string, body []byte, ignore []string) []byte {
	k := newFingerprintKey(key)
	sum := k.fingerprint(method, path, principal, contentType, body, jsoncanon.SplitPaths(ignore))
	return sum[:]
}

// fingerprintKey is the fingerprint's HMAC-SHA-256 key and a pool of MACs
// under it. A crypto/hmac MAC keeps the hash states after the key's inner
// and outer pads once it has been Reset (FIPS 198-1, section 6), so a
// pooled one skips the two pad blocks of every fingerprint: three SHA-256
// blocks instead of five for a small body, a quarter of its instructions
// (docs/design-notes.md, "The engine's hot path"). The pool also saves the
// fingerprint the allocations of its buffer and MAC.
// TestFingerprintVectors holds the bytes to what the hand-prepared pads
// made before.
type fingerprintKey struct {
	macs sync.Pool // of *fingerprinter
}

// fingerprinter is a MAC under one key and the buffer its input is built
// in, pooled together: neither is allocated per fingerprint.
type fingerprinter struct {
	mac hash.Hash
	buf []byte
	sum [FingerprintSize]byte // Sum appends here, so the result does not escape
}

func newFingerprintKey(key []byte) *fingerprintKey {
	key = bytes.Clone(key)
	k := new(fingerprintKey)
	k.macs.New = func() any {
		mac := hmac.New(sha256.New, key)
		mac.Reset() // saves the pads' hash states (see fingerprintKey)
		return &fingerprinter{mac: mac, buf: make([]byte, 0, 4096)}
	}
	return k
}

// maxPooledBuffer keeps a huge body's buffer out of the pool.
const maxPooledBuffer = 64 << 10

func (k *fingerprintKey) fingerprint(method, path, principal, contentType string, body []byte, ignore [][]string) [FingerprintSize]byte {
	f := k.macs.Get().(*fingerprinter)
	buf := append(f.buf[:0], "idem/fingerprint/v2"...)
	buf = appendField(buf, 'm', method)
	buf = appendField(buf, 'p', path)
	buf = appendField(buf, 'u', principal)
	mode := byte('r')
	if isJSONContentType(contentType) {
		// The canonical body goes after a fixed-width length slot that is
		// filled in once its length is known.
		head := len(buf)
		buf = append(buf, 'j', 0, 0, 0, 0, 0, 0, 0, 0)
		out, err := jsoncanon.Append(buf, body, ignore)
		if err == nil {
			binary.BigEndian.PutUint64(out[head+1:head+9], uint64(len(out)-head-9))
			buf, mode = out, 'j'
		} else {
			buf = buf[:head]
		}
	}
	if mode == 'r' {
		buf = append(buf, 'r', 0, 0, 0, 0, 0, 0, 0, 0)
		binary.BigEndian.PutUint64(buf[len(buf)-8:], uint64(len(body)))
		buf = append(buf, body...)
	}
	f.mac.Reset()
	f.mac.Write(buf)
	f.sum[0] = FingerprintVersion
	sum := [FingerprintSize]byte(f.mac.Sum(f.sum[:1]))
	if cap(buf) <= maxPooledBuffer {
		f.buf = buf
		k.macs.Put(f)
	}
	return sum
}

func appendField(buf []byte, tag byte, s string) []byte {
	buf = append(buf, tag)
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// isJSONContentType reports whether the media type of ct (parameters
// ignored, case-insensitive) is application/json or application/*+json.
func isJSONContentType(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	const app = "application/"
	if len(ct) <= len(app) || !strings.EqualFold(ct[:len(app)], app) {
		return false
	}
	sub := ct[len(app):]
	return strings.EqualFold(sub, "json") ||
		(len(sub) > len("+json") && strings.EqualFold(sub[len(sub)-len("+json"):], "+json") && !strings.ContainsAny(sub, " \t/"))
}

// CanonicalJSON returns the RFC 8785 canonical form of body with the members
// named by ignore removed (see Fingerprint for the path syntax). It returns an
// error for invalid JSON and for JSON whose canonical form would lose
// information: duplicate object members, invalid UTF-8, U+FFFD or a lone
// surrogate in a string, nesting deeper than 128 levels, or a number that is
// not exactly a float64 (RFC 8785 numbers are IEEE doubles, so
// 9007199254740993 would silently become ...992 and two different amounts
// would share a fingerprint).
//
// The canonical form is not always accepted again: 2^60 written exactly
// canonicalises to 1152921504606847000, which is not itself an exact double.
// That costs nothing, since a retry sends the same bytes as the original.
func CanonicalJSON(body []byte, ignore []string) ([]byte, error) {
	return jsoncanon.Append(nil, body, jsoncanon.SplitPaths(ignore))
}
