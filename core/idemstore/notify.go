package idemstore

import (
	"crypto/sha256"
	"encoding/hex"
)

// Notifier is an optional capability of a Store: it tells every process
// that uses the same storage that a record left the in-progress state
// (settled or released), so that requests waiting for the record's holder
// claim again at once instead of at their next poll.
//
// A notification is a hint, never a state. A woken waiter claims again
// through Store.Claim, which alone decides what it gets; a notification
// that is lost, late, duplicated or spurious costs latency, never
// correctness. A Store that cannot notify does not implement Notifier, and
// waiters poll.
type Notifier interface {
	// Subscribe makes the store publish a notification each time this
	// process settles or releases a record, from the moment Subscribe
	// returns, and delivers the notifications of every process sharing
	// the storage to fn, with the record's NotifyID, until stop is
	// called. fn is called from one goroutine at a time and must not
	// block. Subscribe may be called more than once; the store keeps one
	// listening connection per Store however many subscriptions it has,
	// and holds no pool connection for it. An error means notifications
	// cannot be delivered (a misconfiguration or an unreachable server):
	// waiters then poll.
	Subscribe(fn func(id string)) (stop func(), err error)
}

// NotifyID returns the identifier a Notifier publishes for the record of
// principal and key: the first 16 hex digits of SHA-256 over the
// principal, a NUL and the key, so that a notification carries neither the
// key nor the principal and its size is fixed.
func NotifyID(principal, key string) string {
	h := sha256.New()
	h.Write([]byte(principal))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}
