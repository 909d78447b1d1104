package storetest

import (
	"context"
	"net/http"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// settle stores state with resp for lease, with no business write.
func settle(ctx context.Context, b Backend, lease idemstore.Lease, state idemstore.State, resp idem.Response) error {
	_, tx, err := b.Store.BeginTx(ctx, lease)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return tx.Settle(ctx, idemstore.Outcome{State: state, Response: resp})
}

// testStats checks every figure of Store.Stats against records made to
// fall in each: in progress (stale and fresh), completed, failed, expired
// in progress and expired settled. A self-expiring store (Redis) has no
// expired records to count, and may report the settled figures as
// NotCounted, never as a wrong number.
func testStats(t *testing.T, b Backend) {
	ctx := ctxT(t)
	empty, err := b.Store.Stats(ctx, Lease)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]idemstore.Count{"InProgress": empty.InProgress, "Completed": empty.Completed,
		"Failed": empty.Failed, "Released": empty.Released, "Stale": empty.Stale, "Expired": empty.Expired} {
		if c != 0 && c != idemstore.NotCounted {
			t.Errorf("empty store: %s = %v, want 0 (or not counted)", name, c)
		}
	}
	if !empty.OldestLockedAt.IsZero() {
		t.Errorf("empty store: OldestLockedAt = %v, want zero", empty.OldestLockedAt)
	}
	if d := time.Since(empty.Now); d > time.Minute || d < -time.Minute {
		t.Fatalf("Stats.Now %v is %v away from this machine's clock", empty.Now, d)
	}

	claim := func(name string, retention time.Duration) idemstore.ClaimRequest {
		req := claimReq("alice", uniq(name), "body")
		req.Retention = retention
		mustClaim(t, b.Store, req)
		return req
	}
	oldest := claim("stale-a", time.Hour)
	claim("stale-b", time.Hour)
	claim("expired-in-progress", Lease)
	if err := b.Store.Release(ctx, leaseOf(claim("released", time.Hour))); err != nil {
		t.Fatalf("release: %v", err)
	}
	for _, c := range []struct {
		state     idemstore.State
		status    int
		retention time.Duration
	}{
		{idemstore.StateCompleted, http.StatusCreated, time.Hour},
		{idemstore.StateFailed, http.StatusUnprocessableEntity, time.Hour},
		{idemstore.StateCompleted, http.StatusOK, Lease}, // expired once settled
	} {
		req := claim(string(c.state), c.retention)
		if err := settle(ctx, b, leaseOf(req), c.state, idem.Response{Status: c.status, Header: http.Header{}, Body: []byte("{}")}); err != nil {
			t.Fatalf("settle %s: %v", c.state, err)
		}
	}
	time.Sleep(Lease + 150*time.Millisecond)
	claim("fresh", time.Hour)
	claimedFresh := time.Now()

	st, err := b.Store.Stats(ctx, Lease)
	if err != nil {
		t.Fatal(err)
	}
	// On a loaded machine the fresh claim may have aged past the lease
	// before Stats ran; only then may it count as stale.
	freshMayBeStale := time.Since(claimedFresh) >= Lease/2
	want := idemstore.Stats{InProgress: 4, Completed: 2, Failed: 1, Released: 1, Stale: 3, Expired: 2}
	if b.SelfExpiring {
		// Both expired records are gone by themselves.
		want = idemstore.Stats{InProgress: 3, Completed: 1, Failed: 1, Released: 1, Stale: 2, Expired: 0}
	}
	check := func(name string, got, want idemstore.Count, alsoOK ...idemstore.Count) {
		t.Helper()
		if got == want {
			return
		}
		for _, ok := range alsoOK {
			if got == ok {
				return
			}
		}
		t.Errorf("Stats.%s = %v, want %v", name, got, want)
	}
	settledMay := []idemstore.Count{}
	if b.SelfExpiring {
		settledMay = append(settledMay, idemstore.NotCounted)
	}
	check("InProgress", st.InProgress, want.InProgress)
	check("Completed", st.Completed, want.Completed, settledMay...)
	check("Failed", st.Failed, want.Failed, settledMay...)
	check("Released", st.Released, want.Released, settledMay...)
	check("Expired", st.Expired, want.Expired, settledMay...)
	if freshMayBeStale {
		check("Stale", st.Stale, want.Stale, want.Stale+1)
	} else {
		check("Stale", st.Stale, want.Stale)
	}
	if got := get(t, b, "alice", oldest.Key).LockedAt; !st.OldestLockedAt.Equal(got) {
		t.Errorf("Stats.OldestLockedAt = %v, want the oldest claim's LockedAt %v", st.OldestLockedAt, got)
	}
	if st.Now.Before(st.OldestLockedAt) {
		t.Errorf("Stats.Now %v is before OldestLockedAt %v", st.Now, st.OldestLockedAt)
	}

	// Stale is what ListStale lists, on the same clock.
	stale, err := b.Store.ListStale(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if st.Stale != idemstore.Count(len(stale)) && !freshMayBeStale {
		t.Errorf("Stats.Stale = %v, ListStale lists %d", st.Stale, len(stale))
	}
	// staleAfter is honoured: nothing is an hour old.
	if long, err := b.Store.Stats(ctx, time.Hour); err != nil || long.Stale != 0 || long.InProgress != st.InProgress {
		t.Errorf("Stats(1h) = %+v, %v; want Stale 0 and InProgress %v", long, err, st.InProgress)
	}
	// A purge takes the expired records out of every figure.
	for range 10 {
		if n, err := b.Store.PurgeExpired(ctx, 100); err != nil || n == 0 {
			break
		}
	}
	after, err := b.Store.Stats(ctx, Lease)
	if err != nil {
		t.Fatal(err)
	}
	if after.Expired != 0 || after.InProgress != 3 || !(after.Completed == 1 || b.SelfExpiring && after.Completed == idemstore.NotCounted) {
		t.Errorf("after PurgeExpired: %+v; want Expired 0, InProgress 3, Completed 1", after)
	}
}
