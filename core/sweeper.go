package idem

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemgo/idem/core/idemstore"
	"log/slog"
	"time"
)

// Sweeper deletes expired records in batches, reports stale claims and,
// given an Engine whose Config.Reconcile is set, resolves them.
//
// Correctness never waits for it: the claim already treats an expired
// record as absent, and a client's retry takes a stale claim over and asks
// Reconcile itself. The sweeper is for the claims no client retries: a
// crashed attempt whose external effect (a charged card) would otherwise
// stay unknown and unrecorded until the record expires. For each stale
// claim it makes the same fenced takeover a retry makes (Store.Claim with
// the record's fingerprint and a new token), so a retrying client and the
// sweeper cannot both hold the key: whichever claims second finds the key
// held (the client gets a 409 and, after it, the reconciled replay or a
// fresh run) or settled. Then it asks Reconcile: a Response is stored as
// completed (or failed, per Config.Classify) in one commit and replayed to
// the next retry; nil, "no effect", releases the key so the next retry runs
// the handler; an error, or any other failure, keeps the claim (Store.Keep)
// for the next sweep or a client to ask again. Without an Engine, or
// without Reconcile, stale claims are only reported.
//
// Several sweepers (one per instance) may run against one store: the
// store's PurgeExpired makes their batches disjoint, and the fenced
// takeover lets one of them resolve each stale claim.
type Sweeper struct {
	// Engine, when set, is the engine whose records are swept: Store and
	// Lease default to its Config's, and with Config.Reconcile set the
	// stale claims are taken over and reconciled. Setting the engine
	// rather than copying its Reconcile keeps the takeover's lease,
	// retention, timeouts and classifier the ones the engine's own
	// takeovers use.
	Engine *Engine
	// Store is swept. Required unless Engine is set.
	Store idemstore.
		// Interval between sweeps. Default 1 minute.
		Store

	Interval time.Duration
	// BatchSize bounds each PurgeExpired call. Default 500.
	BatchSize int
	// MaxBatches bounds the batches of one sweep, so one sweep never holds
	// the database for long. Default 100.
	MaxBatches int
	// Lease is the engine's lease. Zero takes the Engine's, or without one
	// disables the stale report. Which claims are stale is the records'
	// own say (Record.LeaseExpiresAt); Lease is the threshold of
	// Stats.Stale when CountRecords is set.
	Lease time.Duration
	// Logger receives one line per sweep that did something, and every
	// stale claim. Default slog.Default().
	Logger *slog.Logger
	// Observer, when set, receives what every sweep of Run did, failed
	// ones included, for metrics such as a stale-claim gauge.
	Observer SweepObserver
	// CountRecords makes every sweep end with Store.Stats, reported in
	// SweepResult.Stats, for an in-progress gauge. On the SQL stores that
	// is a count over the whole table: on a large table keep Interval at a
	// minute or more.
	CountRecords bool
}

// SweepResult is what one sweep did.
type SweepResult struct {
	// Purged counts the expired records deleted.
	Purged int
	// Backlog is true when the purge stopped at MaxBatches, every batch
	// full: expired records may remain. Run then sweeps again at once
	// instead of waiting for Interval, so a busy store is purged at the
	// rate the database allows, not at BatchSize × MaxBatches per Interval.
	Backlog bool
	// Stale lists in-progress records whose lease had expired, at most
	// BatchSize of them, oldest first, as listed before any was resolved.
	Stale []Record
	// Reconciled counts the stale claims taken over whose Reconcile
	// answer was stored: the next retry replays it.
	Reconciled int
	// Released counts the stale claims taken over and released because
	// Reconcile found no effect (or Config.Classify released its answer):
	// the next retry runs the handler.
	Released int
	// Raced counts the stale claims another attempt (a client's retry,
	// another sweeper) took over or settled first: nothing was done.
	Raced int
	// Stats is the store's count of its records after the sweep, when
	// Sweeper.CountRecords is set and the count succeeded; otherwise nil.
	Stats *idemstore.
		// Failed counts the stale claims whose takeover, Reconcile or store
		// calls failed; Sweep's error says why. Such a claim is kept in
		// progress, Uncertain, and asked about again by the next sweep or
		// retry.
		Stats

	Failed int
}

// SweepObserver receives the result of every sweep a Sweeper's Run makes,
// with the sweep's error (nil on success; res holds what was done before
// it failed). Implementations must return quickly.
type SweepObserver interface {
	ObserveSweep(ctx context.Context, res SweepResult, err error)
}

// Sweep runs one sweep: purge expired records batch by batch until a batch
// deletes nothing (or MaxBatches), then list stale claims. A short batch
// does not end the sweep: with several sweepers at once, one's batch comes
// back short because another deleted part of it, while expired records
// remain.
//
// With an Engine whose Config.Reconcile is set, each stale claim is then
// taken over and reconciled (see Sweeper), one after the other; a failure
// with one does not stop the others, and Sweep returns them all joined.
func (s *Sweeper) Sweep(ctx context.Context) (SweepResult, error) {
	res, err := s.sweep(ctx)
	if !s.CountRecords || errors.Is(err, ErrInvalidConfig) || ctx.Err() != nil {
		return res, err
	}
	store, lease := s.target()
	st, serr := store.Stats(ctx, lease)
	if serr != nil {
		return res, errors.Join(err, fmt.Errorf("idem: sweep: stats: %w", serr))
	}
	res.Stats = &st
	return res, err
}

// target is the store swept and the lease past which a claim is stale.
func (s *Sweeper) target() (idemstore.Store, time.Duration) {
	store, lease := s.Store, s.Lease
	if s.Engine != nil {
		if store == nil {
			store = s.Engine.cfg.Store
		}
		if lease == 0 {
			lease = s.Engine.cfg.Lease
		}
	}
	return store, lease
}

func (s *Sweeper) sweep(ctx context.Context) (SweepResult, error) {
	store, lease := s.target()
	if store == nil {
		return SweepResult{}, fmt.Errorf("%w: Sweeper.Store or Sweeper.Engine is required", ErrInvalidConfig)
	}
	batch, maxBatches := s.BatchSize, s.MaxBatches
	if batch <= 0 {
		batch = 500
	}
	if maxBatches <= 0 {
		maxBatches = 100
	}
	var res SweepResult
	full := 0 // consecutive full batches
	for range maxBatches {
		n, err := store.PurgeExpired(ctx, batch)
		res.Purged += n
		if err != nil {
			return res, fmt.Errorf("idem: sweep: %w", err)
		}
		if n == 0 {
			break
		}
		if n == batch {
			full++
		}
	}
	res.Backlog = full == maxBatches
	if lease <= 0 {
		return res, nil
	}
	stale, err := store.ListStale(ctx, batch)
	if err != nil {
		return res, fmt.Errorf("idem: sweep: list stale: %w", err)
	}
	res.Stale = stale
	if s.Engine == nil || s.Engine.cfg.Reconcile == nil {
		return res, nil
	}
	var errs []error
	for _, r := range stale {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		action, err := s.Engine.reconcileStale(ctx, r)
		switch action {
		case staleReconciled:
			res.Reconciled++
		case staleReleased:
			res.Released++
		case staleRaced:
			res.Raced++
		default:
			res.Failed++
			errs = append(errs, fmt.Errorf("idem: sweep: key_hash %s: %w", keyHash(r.Principal, r.Key), err))
		}
	}
	return res, errors.Join(errs...)
}

// Run sweeps every Interval until ctx is done, logging what each sweep did.
// A sweep that left a backlog (SweepResult.Backlog) is followed at once by
// the next. It returns ctx's error; a failed sweep is logged and retried at
// the next interval.
func (s *Sweeper) Run(ctx context.Context) error {
	if s.Store == nil && s.Engine == nil {
		return fmt.Errorf("%w: Sweeper.Store or Sweeper.Engine is required", ErrInvalidConfig)
	}
	interval, logger := s.Interval, s.Logger
	if interval <= 0 {
		interval = time.Minute
	}
	if logger == nil {
		logger = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := s.Sweep(ctx)
		if s.Observer != nil {
			s.Observer.ObserveSweep(ctx, res, err)
		}
		switch {
		case err != nil && !errors.Is(err, context.Canceled):
			logger.WarnContext(ctx, "idempotency sweep failed", slog.String("error", err.Error()), slog.Int("purged", res.Purged))
		case res.Purged > 0 || res.Reconciled > 0 || res.Released > 0:
			logger.InfoContext(ctx, "idempotency sweep", slog.Int("purged", res.Purged),
				slog.Int("reconciled", res.Reconciled), slog.Int("released", res.Released))
		}
		for _, r := range res.Stale {
			// The key is hashed as in the engine's log: the sweeper has no
			// Config.LogKeys to say otherwise.
			logger.WarnContext(ctx, "stale idempotency claim",
				slog.String("key_hash", keyHash(r.Principal, r.Key)), slog.Time("locked_at", r.LockedAt),
				slog.String("request_id", r.RequestID))
		}
		if res.Backlog && err == nil && ctx.Err() == nil {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
