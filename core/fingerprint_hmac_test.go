package idem

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/idemgo/idem/core/internal/hooks"
)

// TestFingerprintIsHMAC: the fingerprint is exactly crypto/hmac's
// HMAC-SHA-256 of the fingerprint input, built here field by field, for keys
// shorter than, as long as and longer than a SHA-256 block.
func TestFingerprintIsHMAC(t *testing.T) {
	t.Parallel()
	body := []byte("amount=1250&cvv=737")
	msg := []byte("idem/fingerprint/v2")
	msg = appendField(msg, 'm', "POST")
	msg = appendField(msg, 'p', "/payments")
	msg = appendField(msg, 'u', "alice")
	msg = append(msg, 'r', 0, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint64(msg[len(msg)-8:], uint64(len(body)))
	msg = append(msg, body...)
	for _, n := range []int{32, 63, 64, 65, 200} {
		key := bytes.Repeat([]byte{byte(n)}, n)
		key[0] = 0xa5
		m := hmac.New(sha256.New, key)
		m.Write(msg)
		want := m.Sum([]byte{hooks.FingerprintVersion})
		got := fingerprintOf(key, "POST", "/payments", "alice", "application/x-www-form-urlencoded", body, nil)
		if !bytes.Equal(got, want) {
			t.Errorf("key of %d bytes: fingerprint %x, want HMAC-SHA-256 %x", n, got, want)
		}
	}
}

// TestFingerprintKeyReuse: a prepared key's pooled MACs and buffers carry
// nothing from one fingerprint to the next. One key fingerprints a run of
// different requests, a large body among them, twice over; each must
// equal the fingerprint under a key prepared for it alone.
func TestFingerprintKeyReuse(t *testing.T) {
	key := bytes.Repeat([]byte{0x5a}, 32)
	k := newFingerprintKey(key)
	bodies := []struct{ ct, body string }{
		{"application/json", `{"amount":1000,"currency":"EUR"}`},
		{"application/octet-stream", string(bytes.Repeat([]byte("x"), 5000))},
		{"application/json", `{"amount":`},
		{"", ""},
		{"application/json", `{"b":2,"a":1}`},
	}
	for round := range 2 {
		for i, b := range bodies {
			got := k.fingerprint("POST", "/payments", "alice", b.ct, []byte(b.body), nil)
			want := fingerprintOf(key, "POST", "/payments", "alice", b.ct, []byte(b.body), nil)
			if !bytes.Equal(got[:], want) {
				t.Errorf("round %d, body %d: reused key gives %x, a fresh one %x", round, i, got, want)
			}
		}
	}
}
