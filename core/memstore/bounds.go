package memstore

import (
	"fmt"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// size is what e costs under k.
func (e *entry) size(k recordKey) int64 {
	return int64(len(k.principal)+len(k.key)+len(e.data)) + entryOverhead
}

// newEntrySize is what the entry for req will cost, but for its key.
func newEntrySize(req *idemstore.ClaimRequest) int64 {
	return int64(fieldLen(len(req.Fingerprint))+fieldLen(len(req.Token))+fieldLen(len(req.RequestID))) + entryOverhead
}

// responseSize is, roughly, what storing resp adds to an entry.
func responseSize(resp *idem.Response) int64 {
	n := int64(len(resp.Body)) + 16
	for name, vs := range resp.Header {
		n += int64(fieldLen(len(name))) + 2
		for _, v := range vs {
			n += int64(fieldLen(len(v)))
		}
	}
	return n
}

// put stores e under k, replacing old (nil when k held nothing), and keeps
// the counts. Callers hold s.mu and have just read old from s.records.
func (s *Store) put(k recordKey, e entry, old *entry) {
	records, bytes := 1, e.size(k)
	if old != nil {
		records, bytes = 0, bytes-old.size(k)
	}
	s.records[k] = e
	if old == nil || old.expires != e.expires {
		s.expiries.push(expiry{at: e.expires, k: k})
		if len(s.expiries) > 2*len(s.records)+staleSlack {
			s.expiries.rebuild(s.records)
		}
	}
	s.account(k.principal, records, bytes)
}

// remove deletes k, whose entry is e, and keeps the counts. Callers hold
// s.mu.
func (s *Store) remove(k recordKey, e entry) {
	delete(s.records, k)
	s.account(k.principal, -1, -e.size(k))
}

func (s *Store) account(principal string, records int, bytes int64) {
	s.bytes += bytes
	u := s.usage[principal]
	u.records += records
	u.bytes += bytes
	if u.records <= 0 {
		delete(s.usage, principal)
		return
	}
	s.usage[principal] = u
}

// room reports whether records more records and bytes more bytes of
// principal fit in the store's bounds and in principal's share of them,
// evicting expired records first when they do not. Callers hold s.mu.
func (s *Store) room(now int64, principal string, records int, bytes int64) error {
	if s.fits(principal, records, bytes) {
		return nil
	}
	s.evictExpired(now, len(s.records))
	if s.fits(principal, records, bytes) {
		return nil
	}
	u := s.usage[principal]
	return fmt.Errorf("%w: %w (store %d/%d records, %d/%d bytes; principal %d/%d records, %d/%d bytes)",
		idemstore.ErrTransient, ErrFull, len(s.records), s.max, s.bytes, s.maxBytes,
		u.records, s.shareOf(int64(s.max)), u.bytes, s.shareOf(s.maxBytes))
}

func (s *Store) fits(principal string, records int, bytes int64) bool {
	u := s.usage[principal]
	return len(s.records)+records <= s.max && s.bytes+bytes <= s.maxBytes &&
		int64(u.records+records) <= s.shareOf(int64(s.max)) && u.bytes+bytes <= s.shareOf(s.maxBytes)
}

// shareOf is one principal's share of bound n, at least 1.
func (s *Store) shareOf(n int64) int64 {
	return max(int64(float64(n)*s.share), 1)
}
