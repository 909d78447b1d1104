// Package memstore is an in-memory idemstore.Store for tests and single-process
// demos. Records live in one process: it gives no protection across
// instances and loses everything on restart, the records' nonces included:
// after a restart a retry gets a new idem.DownstreamKey, so a provider the
// attempt before the restart reached charges again. It is bounded in records and
// in bytes, in all and per principal: past a bound it evicts expired
// records, and when none has expired it refuses the claim (or the settle of
// a response that does not fit) with an error wrapping idemstore.ErrTransient
// instead of growing. No principal may hold more than its share of either
// bound (WithPrincipalShare), so one caller filling its share leaves room
// for every other.
//
// Each record is kept by value, its variable-length parts (the settled
// response included) encoded in one string, so that a store holding many
// records costs the garbage collector little.
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// Defaults of a Store's bounds.
const (
	// DefaultMaxRecords bounds the records of a Store unless
	// WithMaxRecords says otherwise.
	DefaultMaxRecords = 100_000
	// DefaultMaxBytes bounds the bytes of a Store's records (keys, request
	// ids, stored responses) unless WithMaxBytes says otherwise.
	DefaultMaxBytes = 256 << 20
	// DefaultPrincipalShare is the fraction of each bound one principal
	// may hold unless WithPrincipalShare says otherwise.
	DefaultPrincipalShare = 0.1
)

// entryOverhead is what a record costs beyond its strings: its map slot
// (key, entry and the map's spare room), its place in the expiry queue
// and the string headers, measured (TestRecordCost) just after the map
// and the queue doubled, where a record costs the most.
const entryOverhead = 288

// ErrFull is returned (wrapped with idemstore.ErrTransient) by Claim when the
// store, or the claiming principal's share of it, holds as many unexpired
// records or bytes as its bounds allow, and by Settle when the response
// does not fit in them.
var ErrFull = errors.New("memstore: full")

// Store is an in-memory idemstore.Store. The zero value is not usable; call New.
//
// The times in the records it returns are in the local time zone and carry
// no monotonic clock reading: leases and expiry are measured on the wall
// clock that WithClock sets.
type Store struct {
	mu       sync.Mutex
	records  map[recordKey]entry
	max      int
	maxBytes int64
	share    float64
	now      func() time.Time
	// bytes is what all records cost; usage what each principal's do.
	bytes int64
	usage map[string]usage
	// expiries orders the records by expiry, for evictExpired.
	expiries expiryQueue
}

// usage is what one principal's records cost.
type usage struct {
	records int
	bytes   int64
}

type recordKey struct{ principal, key string }

// Option configures a Store. New returns the error of an option given a
// value it refuses.
type Option func(*Store) error

// WithMaxRecords bounds the number of records kept.
// It must be positive.
func WithMaxRecords(n int) Option {
	return func(s *Store) error {
		if n <= 0 {
			return fmt.Errorf("memstore: WithMaxRecords(%d): must be positive", n)
		}
		s.max = n
		return nil
	}
}

// WithMaxBytes bounds the bytes the records take: principals, keys, request
// ids, fingerprints and stored responses, and 288 bytes per record for the
// store's own structures. That is what a record costs the heap at most,
// measured: a settled record with a UUID key, a 32-byte fingerprint and a
// 35-byte JSON body with two headers costs 465 to 543 bytes, depending on
// how far the store's map has grown into its last doubling, and is counted
// as 536. It must be positive.
func WithMaxBytes(n int64) Option {
	return func(s *Store) error {
		if n <= 0 {
			return fmt.Errorf("memstore: WithMaxBytes(%d): must be positive", n)
		}
		s.maxBytes = n
		return nil
	}
}

// WithPrincipalShare sets the fraction, in (0, 1], of MaxRecords and of
// MaxBytes that one principal's records may take. At 1 one principal may
// fill the store and make every other principal's claims fail until its
// records expire; the default, DefaultPrincipalShare, leaves room for at
// least nine others.
func WithPrincipalShare(f float64) Option {
	return func(s *Store) error {
		if !(f > 0 && f <= 1) {
			return fmt.Errorf("memstore: WithPrincipalShare(%v): must be in (0, 1]", f)
		}
		s.share = f
		return nil
	}
}

// WithClock replaces the store's clock, which plays the part of a database
// clock: leases and expiry are measured on it.
// It must not be nil.
func WithClock(now func() time.Time) Option {
	return func(s *Store) error {
		if now == nil {
			return errors.New("memstore: WithClock(nil)")
		}
		s.now = now
		return nil
	}
}

// New returns an empty Store, or the error of the first option that refuses
// its value.
func New(opts ...Option) (*Store, error) {
	s := &Store{records: make(map[recordKey]entry), max: DefaultMaxRecords, maxBytes: DefaultMaxBytes,
		share: DefaultPrincipalShare, now: time.Now, usage: make(map[string]usage)}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// MustNew is New for tests and examples, where an option is a constant: it
// panics if an option refuses its value.
func MustNew(opts ...Option) *Store {
	s, err := New(opts...)
	if err != nil {
		panic(err)
	}
	return s
}

// Len returns the number of records held, expired ones included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// Claim implements idemstore.Store. The whole decision runs under one lock, which
// is the in-memory form of a single atomic statement.
func (s *Store) Claim(_ context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	req.RequestID = idemstore.BoundRequestID(req.RequestID)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	t := now.UnixNano()
	k := recordKey{req.Principal, req.Key}
	created, reclaimed, uncertain, nonce := t, false, false, req.Nonce
	e, ok := s.records[k]
	switch {
	case !ok:
		if err := s.room(t, k.principal, 1, int64(len(k.principal)+len(k.key))+newEntrySize(&req)); err != nil {
			return idemstore.ClaimResult{}, err
		}
	case t >= e.expires:
		// Expired: absent as far as correctness goes.
	case e.state == idemstore.StateReleased:
		// Absent too, but its nonce is kept for the same request (see
		// idemstore.StateReleased).
		if e.fingerprint() == string(req.Fingerprint) {
			nonce = e.nonce()
		}
	case e.state == idemstore.StateInProgress && t >= e.leaseUntil &&
		e.fingerprint() == string(req.Fingerprint) && (!e.uncertain || req.TakeOverUncertain):
		// A takeover keeps the record's nonce (see idem.Record.Nonce) and
		// its Uncertain mark.
		created, reclaimed, uncertain, nonce = e.created, true, e.uncertain, e.nonce()
	default:
		return idemstore.ClaimResult{Record: e.record(k), Now: now}, nil
	}
	var old *entry
	if ok {
		old = &e
	}
	n := newEntry(&req, nonce, created, t)
	n.uncertain = uncertain
	s.put(k, n, old)
	// The store keeps its own copy, so the record can be made of the
	// caller's request.
	rec := n.meta(k)
	rec.Fingerprint, rec.LeaseToken, rec.RequestID, rec.Nonce = req.Fingerprint, req.Token, req.RequestID, nonce
	return idemstore.ClaimResult{Claimed: true, Reclaimed: reclaimed, Record: rec, Now: now}, nil
}

// evictExpired deletes at most n records expired at now, the soonest
// expired first, reading only the expired ones (see expiryQueue). Callers
// hold s.mu.
func (s *Store) evictExpired(now int64, n int) {
	for n > 0 && len(s.expiries) > 0 && s.expiries[0].at <= now {
		x := s.expiries.pop()
		// A record whose expiry changed since x was queued (claimed
		// again) has a later place in the queue.
		if e, ok := s.records[x.k]; ok && e.expires == x.at {
			s.remove(x.k, e)
			n--
		}
	}
}

// held returns the key and entry of the record l holds, and whether there
// is one. Callers hold s.mu.
func (s *Store) held(l idemstore.Lease) (recordKey, entry, bool) {
	k := recordKey{l.Principal, l.Key}
	e, ok := s.records[k]
	return k, e, ok && e.state == idemstore.StateInProgress && e.token() == l.Token
}

// Release implements idemstore.Store.
func (s *Store) Release(_ context.Context, l idemstore.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, e, ok := s.held(l)
	if !ok {
		return idemstore.ErrLeaseLost
	}
	// Its size stays the same: the record keeps every field until it
	// expires (see idemstore.StateReleased).
	e.state, e.uncertain = idemstore.StateReleased, false
	s.records[k] = e
	return nil
}

// Keep implements idemstore.Store.
func (s *Store) Keep(_ context.Context, l idemstore.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, e, ok := s.held(l)
	if !ok {
		return idemstore.ErrLeaseLost
	}
	e.uncertain, e.leaseUntil = true, s.now().UnixNano()
	s.records[k] = e
	return nil
}

// Get implements idemstore.Store.
func (s *Store) Get(_ context.Context, principal, key string) (idem.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := recordKey{principal, key}
	e, ok := s.records[k]
	if !ok {
		return idem.Record{}, idemstore.ErrNotFound
	}
	return e.record(k), nil
}

// PurgeExpired implements idemstore.Store.
func (s *Store) PurgeExpired(_ context.Context, limit int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before := len(s.records)
	s.evictExpired(s.now().UnixNano(), limit)
	return before - len(s.records), nil
}

// ListStale implements idemstore.Store. It decodes only the records it returns.
func (s *Store) ListStale(_ context.Context, limit int) ([]idem.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UnixNano()
	type keyed struct {
		k recordKey
		e entry
	}
	var stale []keyed
	for k, e := range s.records {
		if e.state == idemstore.StateInProgress && now >= e.leaseUntil {
			stale = append(stale, keyed{k, e})
		}
	}
	if len(stale) == 0 {
		return nil, nil
	}
	slices.SortFunc(stale, func(a, b keyed) int { return cmp.Compare(a.e.leaseUntil, b.e.leaseUntil) })
	if len(stale) > limit {
		stale = stale[:limit]
	}
	recs := make([]idem.Record, len(stale))
	for i, r := range stale {
		recs[i] = r.e.record(r.k)
	}
	return recs, nil
}

// BeginTx implements idemstore.Store. The transaction buffers nothing itself:
// work registered with OnCommit runs atomically with the settle.
func (s *Store) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	c := &txContext{Context: ctx, tx: Handle{store: s, lease: l}}
	c.st.tx = &c.tx
	return c, &c.st, nil
}

// A txContext is the context BeginTx returns: its ctx, carrying the
// transaction, which is allocated with it.
type txContext struct {
	context.Context
	tx Handle
	st storeTx
}

type txKey struct{}

// Value returns the transaction for txKey and asks the parent otherwise.
func (c *txContext) Value(key any) any {
	if key == (txKey{}) {
		return &c.tx
	}
	return c.Context.Value(key)
}

// Handle is the handle a handler gets to a memstore transaction, through
// Tx. It can add work to the transaction and make it fail, but not end
// it: the store commits it with the stored outcome after the handler
// returns, or rolls it back.
type Handle struct {
	store    *Store
	lease    idemstore.Lease
	mu       sync.Mutex
	onCommit []func()
	failWith error
	done     bool
	used     bool
}

// Tx returns the memstore transaction carried by ctx, if any; ctx may
// be a framework's own context an adapter stored the attempt in (see
// idem.AttemptContext).
func Tx(ctx context.Context) (*Handle, bool) {
	ctx, _ = idem.AttemptContext(ctx)
	tx, ok := ctx.Value(txKey{}).(*Handle)
	return tx, ok
}

// OnCommit registers fn to run when the transaction commits, atomically
// with the settle: the in-memory stand-in for a business write. Once the
// store has finished the transaction, fn is dropped.
func (tx *Handle) OnCommit(fn func()) {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tx.used = true
	if !tx.done {
		tx.onCommit = append(tx.onCommit, fn)
	}
}

// FailCommit makes the commit fail with err, as a database does after a
// statement in the transaction failed.
func (tx *Handle) FailCommit(err error) {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tx.used = true
	tx.failWith = err
}

// storeTx is the idemstore.Tx the engine drives; the handler never sees it.
type storeTx struct{ tx *Handle }

// Settle implements idemstore.Tx. The store keeps a copy of the outcome's
// response.
func (st *storeTx) Settle(_ context.Context, out idemstore.Outcome) error {
	tx := st.tx
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return errors.New("memstore: settle: transaction already finished")
	}
	tx.done = true
	if tx.failWith != nil {
		return fmt.Errorf("memstore: commit: %w", tx.failWith)
	}
	s := tx.store
	s.mu.Lock()
	defer s.mu.Unlock()
	k, e, ok := s.held(tx.lease)
	if !ok {
		return idemstore.ErrLeaseLost
	}
	if err := s.room(s.now().UnixNano(), k.principal, 0, responseSize(&out.Response)); err != nil {
		return fmt.Errorf("memstore: settle: %w", err)
	}
	old := e
	e.settle(out.State, &out.Response)
	s.put(k, e, &old)
	for _, fn := range tx.onCommit {
		fn()
	}
	return nil
}

// Rollback implements idemstore.Tx.
func (st *storeTx) Rollback(context.Context) error {
	tx := st.tx
	tx.mu.Lock()
	defer tx.mu.Unlock()
	tx.done = true
	tx.onCommit = nil
	return nil
}

// Used implements idemstore.Tx.
func (st *storeTx) Used() bool {
	st.tx.mu.Lock()
	defer st.tx.mu.Unlock()
	return st.tx.used
}

var _ idemstore.Store = (*Store)(nil)
