package idemclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
)

// MaxKeyLength is the longest key Config.NewKey may return: what idem,
// and most servers, accept.
const MaxKeyLength = 255

// NewKey returns a random UUIDv4 in its 36-character text form
// ("7f3a0c1e-…"): 122 random bits from crypto/rand. It is the default
// Config.NewKey. Call it yourself when the key must outlive the process:
// store it with the order before the first request, then send it with
// WithKey on every try, also after a restart.
func NewKey() string {
	var u [16]byte
	_, _ = rand.Read(u[:])  // never fails (crypto/rand since Go 1.24)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
	return string(b[:])
}

type keyCtxKey struct{}

// WithKey returns a context that makes a Transport send key as the
// idempotency key of every request made with it, instead of a new one.
// Use it to keep one key across calls to http.Client.Do (a retry after the
// process restarted, or your own retry loop). A key header set on the
// request itself takes precedence over it; an empty key is ignored.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtxKey{}, key)
}

// keyFrom returns the key WithKey put in ctx, or "".
func keyFrom(ctx context.Context) string {
	k, _ := ctx.Value(keyCtxKey{}).(string)
	return k
}

// validKey reports whether k is 1 to MaxKeyLength visible ASCII
// characters.
func validKey(k string) bool {
	if k == "" || len(k) > MaxKeyLength {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}
