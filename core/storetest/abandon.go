package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// abandonLease is the holder's lease in the AbandonedHolder case: long
// enough that the refused claims before its end are many.
const abandonLease = time.Second

// testAbandonedHolder: a holder claims, begins, writes its business effect
// and vanishes before it settles, as a process killed mid-request does:
// its server connection drops (Backend.DropConn) or, for a store whose
// transaction holds none, it just never comes back. Nothing it wrote
// commits, its claim stays in progress under its token, and the key is
// refused until the record's lease deadline on the store's clock and
// claimable right after it; the retry then settles with exactly one
// business write.
func testAbandonedHolder(t *testing.T, b Backend) {
	ctx := ctxT(t)
	holder := claimReq("alice", uniq("abandoned"), "body")
	holder.Lease = abandonLease
	mustClaim(t, b.Store, holder)
	// On a single-writer database an open write transaction would block
	// every claim, so a holder that leaves its transaction open there
	// vanishes before it begins.
	if b.DropConn != nil || !b.SingleWriter {
		txCtx, tx, err := b.Store.BeginTx(ctx, leaseOf(holder))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) }) // the abandoned transaction's resources, not its outcome
		if err := b.WriteEffect(txCtx, holder.Key); err != nil {
			t.Fatal(err)
		}
		if b.DropConn != nil {
			if err := b.DropConn(txCtx); err != nil {
				t.Fatalf("DropConn: %v", err)
			}
		}
	}
	if n := effects(t, b, holder.Key); n != 0 && !b.NoSharedTx {
		t.Fatalf("the vanished holder's business write committed (%d)", n)
	}
	rec := get(t, b, "alice", holder.Key)
	if rec.State != idemstore.StateInProgress || rec.LeaseToken != holder.Token {
		t.Fatalf("after the holder vanished the record is %+v, want its in-progress claim", rec)
	}
	// Fresh claims until one takes over; the store's clock (ClaimResult.Now)
	// says when each was decided.
	deadline, refused := rec.LeaseExpiresAt, 0
	for start := time.Now(); ; {
		if time.Since(start) > abandonLease+10*time.Second {
			t.Fatalf("no claim took the key over %v after the holder vanished", time.Since(start))
		}
		retry := claimReq("alice", holder.Key, "body")
		retry.Lease = time.Minute
		res, err := b.Store.Claim(ctx, retry)
		if errors.Is(err, idemstore.ErrTransient) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !res.Claimed {
			if !res.Now.Before(deadline) {
				t.Fatalf("a claim was refused at %v, at or after the lease deadline %v", res.Now, deadline)
			}
			refused++
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if late := res.Now.Sub(deadline); !res.Reclaimed || late < 0 || late > 500*time.Millisecond {
			t.Fatalf("claimed at %v (Reclaimed %v), %v after the lease deadline %v; want a takeover within the poll interval",
				res.Now, res.Reclaimed, late, deadline)
		}
		if err := settleWithEffect(ctx, b, leaseOf(retry), holder.Key, okResponse("retry")); err != nil {
			t.Fatalf("the retry's settle: %v", err)
		}
		t.Logf("%d claims refused before the lease deadline, taken over %v after it", refused, res.Now.Sub(deadline))
		break
	}
	want := 1
	if b.NoSharedTx && (b.DropConn != nil || !b.SingleWriter) {
		want = 2 // the vanished holder's own write stands
	}
	if n := effects(t, b, holder.Key); n != want {
		t.Fatalf("after the retry: %d business writes, want %d", n, want)
	}
}
