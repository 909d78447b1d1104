package idem

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"strings"
	"sync"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/internal/hooks"
	"github.com/idemgo/idem/core/internal/jsoncanon"
)

// The fingerprint's input format is versioned by its "idem/fingerprint/v2"
// prefix and the stored value by its first byte, hooks.FingerprintVersion:
// changing either changes every fingerprint, so in-flight retries across an
// upgrade would get 422. Bump both, never edit them in place. (v1 was an
// unkeyed SHA-256 of the same input, 32 bytes with no version byte.)

// fingerprintOf is idemadapter.Fingerprint.
func fingerprintOf(key []byte, method, path, principal, contentType string, body []byte, ignore []string) []byte {
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
	sum [idemstore.FingerprintSize]byte // Sum appends here, so the result does not escape
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

func (k *fingerprintKey) fingerprint(method, path, principal, contentType string, body []byte, ignore [][]string) [idemstore.FingerprintSize]byte {
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
	f.sum[0] = hooks.FingerprintVersion
	sum := [idemstore.FingerprintSize]byte(f.mac.Sum(f.sum[:1]))
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

// canonicalJSON returns the RFC 8785 canonical form of body with the members
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
func canonicalJSON(body []byte, ignore []string) ([]byte, error) {
	return jsoncanon.Append(nil, body, jsoncanon.SplitPaths(ignore))
}
