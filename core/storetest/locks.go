package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// lockBound is the lock timeout of the store the BoundedWaits case runs.
const lockBound = 300 * time.Millisecond

// testBoundedWaits: every call that meets a record another transaction
// holds (a settle that has not committed yet) answers within the store's
// lock timeout with an error wrapping idemstore.ErrTransient, instead of
// waiting for that transaction: a claim of a key in progress, the takeover
// of a stale one, the replay of a completed one, a release, a Keep and a
// settle, which then commits nothing. Get does not wait at all. With
// Backend.StatementBounded, the same holds for a store whose statement
// timeout is the bound and whose lock timeout is longer.
func testBoundedWaits(t *testing.T, b Backend) {
	if b.HoldRecord == nil || b.LockBounded == nil {
		t.Skip("not applicable: the backend cannot hold a record from outside or bound a store's lock waits (Backend.HoldRecord, Backend.LockBounded)")
	}
	t.Run("LockTimeout", func(t *testing.T) { boundedWaits(t, b, b.LockBounded(t, lockBound)) })
	t.Run("StatementTimeout", func(t *testing.T) {
		if b.StatementBounded == nil {
			t.Skip("not applicable: the store has no statement timeout apart from its lock timeout (Backend.StatementBounded)")
		}
		boundedWaits(t, b, b.StatementBounded(t, lockBound))
	})
}

func boundedWaits(t *testing.T, b Backend, s idemstore.Store) {
	ctx := ctxT(t)
	claim := func(req idemstore.ClaimRequest) error {
		next := claimReq(req.Principal, req.Key, "body")
		next.Lease = time.Hour
		_, err := s.Claim(ctx, next)
		return err
	}
	ops := []struct {
		name          string
		lease         time.Duration
		settled, free bool // the held record is completed; the call does not wait
		do            func(req idemstore.ClaimRequest) error
	}{
		{name: "claim of a key in progress", lease: time.Hour, do: claim},
		{name: "takeover of a stale key", lease: time.Millisecond, do: claim},
		{name: "replay of a completed key", lease: time.Hour, settled: true, do: claim},
		{name: "release", lease: time.Hour, do: func(req idemstore.ClaimRequest) error { return s.Release(ctx, leaseOf(req)) }},
		{name: "keep", lease: time.Hour, do: func(req idemstore.ClaimRequest) error { return s.Keep(ctx, leaseOf(req)) }},
		{name: "settle", lease: time.Hour, do: func(req idemstore.ClaimRequest) error {
			txCtx, tx, err := s.BeginTx(ctx, leaseOf(req))
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if err := b.WriteEffect(txCtx, req.Key); err != nil {
				return err
			}
			return tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("late")})
		}},
		{name: "get", lease: time.Hour, free: true, do: func(req idemstore.ClaimRequest) error {
			_, err := s.Get(ctx, req.Principal, req.Key)
			return err
		}},
	}
	for _, o := range ops {
		req := claimReq("alice", uniq("held"), "body")
		req.Lease = o.lease
		mustClaim(t, b.Store, req)
		if o.settled {
			if err := settle(ctx, b, leaseOf(req), idemstore.StateCompleted, okResponse("first")); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2 * time.Millisecond) // a stale key's lease has ended
		release := b.HoldRecord(t, req.Principal, req.Key)
		start := time.Now()
		err := o.do(req)
		took := time.Since(start)
		release()
		switch {
		case o.free && (err != nil || took > lockBound):
			t.Fatalf("%s of a held record: %v after %v, want an answer without waiting", o.name, err, took)
		case o.free:
		case !errors.Is(err, idemstore.ErrTransient):
			t.Fatalf("%s behind a held record: %v after %v, want an error wrapping ErrTransient", o.name, err, took)
		case took < lockBound/2 || took > lockBound+2*time.Second:
			t.Fatalf("%s behind a held record answered after %v, want about the bound %v", o.name, took, lockBound)
		}
		if n := effects(t, b, req.Key); n != 0 {
			t.Fatalf("%s: %d business writes committed", o.name, n)
		}
	}
}
