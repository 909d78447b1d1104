package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Sweeper deletes expired records in batches and reports stale claims.
// Correctness never waits for it: the claim already treats an expired
// record as absent. Several sweepers (one per instance) may run against one
// store; the store's PurgeExpired makes their batches disjoint.
type Sweeper struct {
	// Store is swept. Required.
	Store Store
	// Interval between sweeps. Default 1 minute.
	Interval time.Duration
	// BatchSize bounds each PurgeExpired call. Default 500.
	BatchSize int
	// MaxBatches bounds the batches of one sweep, so one sweep never holds
	// the database for long. Default 100.
	MaxBatches int
	// Lease is the engine's lease: in-progress records older than it are
	// reported as stale. Zero disables the report.
	Lease time.Duration
	// Logger receives one line per sweep that did something, and every
	// stale claim. Default slog.Default().
	Logger *slog.Logger
	// Observer, when set, receives what every sweep of Run did, failed
	// ones included, for metrics such as a stale-claim gauge.
	Observer SweepObserver
}

// SweepResult is what one sweep did.
type SweepResult struct {
	// Purged counts the expired records deleted.
	Purged int
	// Stale lists in-progress records whose lease had expired, at most
	// BatchSize of them, oldest first.
	Stale []Record
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
func (s *Sweeper) Sweep(ctx context.Context) (SweepResult, error) {
	batch, maxBatches := s.BatchSize, s.MaxBatches
	if batch <= 0 {
		batch = 500
	}
	if maxBatches <= 0 {
		maxBatches = 100
	}
	var res SweepResult
	for range maxBatches {
		n, err := s.Store.PurgeExpired(ctx, batch)
		res.Purged += n
		if err != nil {
			return res, fmt.Errorf("idem: sweep: %w", err)
		}
		if n == 0 {
			break
		}
	}
	if s.Lease > 0 {
		stale, err := s.Store.ListStale(ctx, s.Lease, batch)
		if err != nil {
			return res, fmt.Errorf("idem: sweep: list stale: %w", err)
		}
		res.Stale = stale
	}
	return res, nil
}

// Run sweeps every Interval until ctx is done, logging what each sweep did.
// It returns ctx's error; a failed sweep is logged and retried at the next
// interval.
func (s *Sweeper) Run(ctx context.Context) error {
	if s.Store == nil {
		return fmt.Errorf("%w: Sweeper.Store is required", ErrInvalidConfig)
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
		case res.Purged > 0:
			logger.InfoContext(ctx, "idempotency sweep", slog.Int("purged", res.Purged))
		}
		for _, r := range res.Stale {
			logger.WarnContext(ctx, "stale idempotency claim",
				slog.String("key", r.Key), slog.Time("locked_at", r.LockedAt), slog.String("request_id", r.RequestID))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
