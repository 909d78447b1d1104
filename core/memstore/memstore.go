// Package memstore is an in-memory idem.Store for tests and single-process
// demos. Records live in one process: it gives no protection across
// instances and loses everything on restart. It is bounded: past
// MaxRecords it evicts expired records, and when none has expired it refuses
// new claims with an error wrapping idem.ErrTransient instead of growing.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	idem "github.com/idemgo/idem/core"
)

// DefaultMaxRecords bounds a Store unless WithMaxRecords says otherwise.
const DefaultMaxRecords = 100_000

// ErrFull is returned (wrapped with idem.ErrTransient) by Claim when the store
// holds MaxRecords unexpired records.
var ErrFull = errors.New("memstore: full")

// Store is an in-memory idem.Store. The zero value is not usable; call New.
type Store struct {
	mu      sync.Mutex
	records map[recordKey]*idem.Record
	max     int
	now     func() time.Time
}

type recordKey struct{ principal, key string }

// Option configures a Store.
type Option func(*Store)

// WithMaxRecords bounds the number of records kept.
func WithMaxRecords(n int) Option { return func(s *Store) { s.max = n } }

// WithClock replaces the store's clock, which plays the part of a database
// clock: leases and expiry are measured on it.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{records: make(map[recordKey]*idem.Record), max: DefaultMaxRecords, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Len returns the number of records held, expired ones included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// Claim implements idem.Store. The whole decision runs under one lock, which
// is the in-memory form of a single atomic statement.
func (s *Store) Claim(_ context.Context, req idem.ClaimRequest) (idem.ClaimResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	k := recordKey{req.Principal, req.Key}
	fresh := &idem.Record{
		Principal: req.Principal, Key: req.Key, Fingerprint: slices.Clone(req.Fingerprint),
		State: idem.StateInProgress, LeaseToken: req.Token, RequestID: req.RequestID,
		CreatedAt: now, LockedAt: now, ExpiresAt: now.Add(req.Retention),
	}
	rec, ok := s.records[k]
	switch {
	case !ok:
		if len(s.records) >= s.max {
			s.evictExpired(now, len(s.records)-s.max+1)
		}
		if len(s.records) >= s.max {
			return idem.ClaimResult{}, fmt.Errorf("%w: %w (%d records)", idem.ErrTransient, ErrFull, s.max)
		}
	case !now.Before(rec.ExpiresAt):
		// Expired: absent as far as correctness goes.
	case rec.State == idem.StateInProgress && now.Sub(rec.LockedAt) >= req.Lease &&
		string(rec.Fingerprint) == string(req.Fingerprint):
		fresh.CreatedAt = rec.CreatedAt
		s.records[k] = fresh
		return idem.ClaimResult{Claimed: true, Reclaimed: true, Record: copyRecord(fresh), Now: now}, nil
	default:
		return idem.ClaimResult{Record: copyRecord(rec), Now: now}, nil
	}
	s.records[k] = fresh
	// The caller gets the record by value; its fingerprint slice is the
	// store's copy, which nothing mutates.
	return idem.ClaimResult{Claimed: true, Record: *fresh, Now: now}, nil
}

func (s *Store) evictExpired(now time.Time, n int) {
	for k, r := range s.records {
		if n == 0 {
			return
		}
		if !now.Before(r.ExpiresAt) {
			delete(s.records, k)
			n--
		}
	}
}

// held returns the record lease holds, or nil. Callers hold s.mu.
func (s *Store) held(l idem.Lease) *idem.Record {
	rec, ok := s.records[recordKey{l.Principal, l.Key}]
	if !ok || rec.State != idem.StateInProgress || rec.LeaseToken != l.Token {
		return nil
	}
	return rec
}

// Release implements idem.Store.
func (s *Store) Release(_ context.Context, l idem.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held(l) == nil {
		return idem.ErrLeaseLost
	}
	delete(s.records, recordKey{l.Principal, l.Key})
	return nil
}

// Get implements idem.Store.
func (s *Store) Get(_ context.Context, principal, key string) (idem.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[recordKey{principal, key}]
	if !ok {
		return idem.Record{}, idem.ErrNotFound
	}
	return copyRecord(rec), nil
}

// PurgeExpired implements idem.Store.
func (s *Store) PurgeExpired(_ context.Context, limit int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before := len(s.records)
	s.evictExpired(s.now(), limit)
	return before - len(s.records), nil
}

// ListStale implements idem.Store.
func (s *Store) ListStale(_ context.Context, olderThan time.Duration, limit int) ([]idem.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var stale []idem.Record
	for _, r := range s.records {
		if r.State == idem.StateInProgress && now.Sub(r.LockedAt) >= olderThan {
			stale = append(stale, copyRecord(r))
		}
	}
	slices.SortFunc(stale, func(a, b idem.Record) int { return a.LockedAt.Compare(b.LockedAt) })
	if len(stale) > limit {
		stale = stale[:limit]
	}
	return stale, nil
}

// BeginTx implements idem.Store. The transaction buffers nothing itself:
// work registered with OnCommit runs atomically with the settle.
func (s *Store) BeginTx(ctx context.Context, l idem.Lease) (context.Context, idem.Tx, error) {
	tx := &Tx{store: s, lease: l}
	return context.WithValue(ctx, txKey{}, tx), tx, nil
}

type txKey struct{}

// Tx is a memstore transaction. Handlers reach it with TxFrom.
type Tx struct {
	store    *Store
	lease    idem.Lease
	mu       sync.Mutex
	onCommit []func()
	failWith error
	done     bool
}

// TxFrom returns the memstore transaction carried by ctx, if any.
func TxFrom(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// OnCommit registers fn to run when the transaction commits, atomically
// with the settle: the in-memory stand-in for a business write.
func (tx *Tx) OnCommit(fn func()) {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tx.onCommit = append(tx.onCommit, fn)
}

// FailCommit makes the commit fail with err, as a database does after a
// statement in the transaction failed.
func (tx *Tx) FailCommit(err error) {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tx.failWith = err
}

// Settle implements idem.Tx.
func (tx *Tx) Settle(_ context.Context, out idem.Outcome) error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return errors.New("memstore: transaction already finished")
	}
	tx.done = true
	if tx.failWith != nil {
		return fmt.Errorf("memstore: commit: %w", tx.failWith)
	}
	s := tx.store
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.held(tx.lease)
	if rec == nil {
		return idem.ErrLeaseLost
	}
	resp := copyResponse(&out.Response)
	rec.State, rec.Response = out.State, resp
	for _, fn := range tx.onCommit {
		fn()
	}
	return nil
}

// Rollback implements idem.Tx.
func (tx *Tx) Rollback(context.Context) error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tx.done = true
	tx.onCommit = nil
	return nil
}

func copyRecord(r *idem.Record) idem.Record {
	c := *r
	c.Fingerprint = slices.Clone(r.Fingerprint)
	c.Response = copyResponse(r.Response)
	return c
}

func copyResponse(r *idem.Response) *idem.Response {
	if r == nil {
		return nil
	}
	h := make(http.Header, len(r.Header))
	for k, v := range r.Header {
		h[k] = slices.Clone(v)
	}
	return &idem.Response{Status: r.Status, Header: h, Body: slices.Clone(r.Body)}
}

var _ idem.Store = (*Store)(nil)
