package idemstore

import (
	"strconv"
	"time"
)

// Count is one figure of Stats: a number of records, or NotCounted when the
// store cannot count it without scanning every key (Redis keeps no count of
// its settled records). It is never a guess.
type Count int64

// NotCounted is the Count of a figure the store does not count.
const NotCounted Count = -1

// Counted reports whether c is a number (false for NotCounted).
func (c Count) Counted() bool { return c >= 0 }

// String returns the number, or "not counted".
func (c Count) String() string {
	if !c.Counted() {
		return "not counted"
	}
	return strconv.FormatInt(int64(c), 10)
}

// MarshalJSON encodes the number, or null for NotCounted, so that a script
// reading the figure cannot mistake "not counted" for a count.
func (c Count) MarshalJSON() ([]byte, error) {
	if !c.Counted() {
		return []byte("null"), nil
	}
	return strconv.AppendInt(nil, int64(c), 10), nil
}

// Stats is what Store.Stats counts of a store's records at one instant of
// the store's clock. A store that cannot count a figure reports NotCounted
// for it, and documents which.
type Stats struct {
	// Now is the store's clock when it counted. Ages are measured from it.
	Now time.Time
	// InProgress, Completed, Failed and Released count the records stored
	// in each state, including expired records not yet purged (counted in
	// Expired too).
	InProgress, Completed, Failed, Released Count
	// Stale counts the in-progress records whose lease was taken at least
	// staleAfter before Now. When every lease is staleAfter long (one
	// engine's Lease) these are the records ListStale lists, which judges
	// each by its own LeaseExpiresAt.
	Stale Count
	// OldestLockedAt is when the oldest in-progress record's lease was
	// taken (store clock); zero when no record is in progress.
	OldestLockedAt time.Time
	// Expired counts the records past their ExpiresAt that PurgeExpired
	// has still to delete. They count as absent for every claim.
	Expired Count
}
