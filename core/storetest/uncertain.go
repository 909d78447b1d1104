package storetest

import (
	"errors"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// testKeep: Keep leaves the held record in progress, marks it Uncertain and
// ends its lease; a claim takes such a record over only with
// TakeOverUncertain, keeping the mark and the nonce; settling or releasing
// clears the mark. Keep is fenced like Release.
func testKeep(t *testing.T, b Backend) {
	ctx := ctxT(t)
	req := claimReq("alice", uniq("k"), "body")
	req.Lease = time.Hour
	mustClaim(t, b.Store, req)
	nonce := storedNonce(b, req.Nonce)

	wrong := leaseOf(req)
	wrong.Token = token()
	if err := b.Store.Keep(ctx, wrong); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Keep with a foreign token = %v, want ErrLeaseLost", err)
	}
	if rec := get(t, b, "alice", req.Key); rec.Uncertain || rec.LeaseToken != req.Token {
		t.Fatalf("a foreign Keep touched the record: %+v", rec)
	}
	if err := b.Store.Keep(ctx, leaseOf(req)); err != nil {
		t.Fatalf("holder's Keep: %v", err)
	}

	// Without TakeOverUncertain the kept record is returned as it is, at
	// once (its lease ended with the Keep), whatever the request's lease.
	blind := claimReq("alice", req.Key, "body")
	blind.Lease = time.Millisecond
	res := mustClaim(t, b.Store, blind)
	if res.Claimed {
		t.Fatal("a claim without TakeOverUncertain took over an Uncertain record")
	}
	kept := res.Record
	if kept.State != idemstore.StateInProgress || !kept.Uncertain || kept.LeaseToken != req.Token || kept.Nonce != nonce ||
		kept.Response != nil || res.Now.Before(kept.LeaseExpiresAt) {
		t.Fatalf("kept record = %+v (now %v), want in progress, Uncertain, the holder's token and nonce, its lease ended", kept, res.Now)
	}
	if rec := get(t, b, "alice", req.Key); !rec.Uncertain || rec.LeaseToken != req.Token {
		t.Fatalf("the refused claim changed the record: %+v", rec)
	}
	if stale, err := b.Store.ListStale(ctx, 1000); err != nil || !holds(stale, req.Key) {
		t.Fatalf("ListStale = %d records, %v; want the kept record listed at once", len(stale), err)
	}

	// Another request never takes it over.
	other := claimReq("alice", req.Key, "another body")
	other.TakeOverUncertain = true
	if res := mustClaim(t, b.Store, other); res.Claimed {
		t.Fatal("a claim with another fingerprint took over the kept record")
	}

	// The takeover Reconcile asks for keeps the mark and the nonce.
	ask := claimReq("alice", req.Key, "body")
	ask.TakeOverUncertain, ask.Lease = true, time.Hour
	res = mustClaim(t, b.Store, ask)
	if !res.Claimed || !res.Reclaimed {
		t.Fatalf("TakeOverUncertain: Claimed=%v Reclaimed=%v, want a takeover", res.Claimed, res.Reclaimed)
	}
	for _, rec := range []idem.Record{res.Record, get(t, b, "alice", req.Key)} {
		if !rec.Uncertain || rec.Nonce != nonce || rec.LeaseToken != ask.Token || !rec.LeaseExpiresAt.After(res.Now.Add(59*time.Minute)) {
			t.Fatalf("taken-over record = %+v, want Uncertain, nonce %q, the new token and a lease of an hour from %v", rec, nonce, res.Now)
		}
	}
	if err := b.Store.Keep(ctx, leaseOf(req)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Keep with the taken-over token = %v, want ErrLeaseLost", err)
	}
	if err := settleWithEffect(ctx, b, leaseOf(ask), ask.Key, okResponse("kept")); err != nil {
		t.Fatal(err)
	}
	if rec := get(t, b, "alice", req.Key); rec.State != idemstore.StateCompleted || rec.Uncertain {
		t.Fatalf("settled record = %+v, want completed and not Uncertain", rec)
	}
	if err := b.Store.Keep(ctx, leaseOf(ask)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Keep of a settled record = %v, want ErrLeaseLost", err)
	}

	// Releasing a kept record (Reconcile found no effect) clears the mark.
	rel := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, rel)
	if err := b.Store.Keep(ctx, leaseOf(rel)); err != nil {
		t.Fatal(err)
	}
	again := claimReq("alice", rel.Key, "body")
	again.TakeOverUncertain = true
	if res := mustClaim(t, b.Store, again); !res.Reclaimed {
		t.Fatal("TakeOverUncertain did not take the kept record over")
	}
	if err := b.Store.Release(ctx, leaseOf(again)); err != nil {
		t.Fatal(err)
	}
	if rec := get(t, b, "alice", rel.Key); rec.State != idemstore.StateReleased || rec.Uncertain {
		t.Fatalf("released record = %+v, want released and not Uncertain", rec)
	}
	if err := b.Store.Keep(ctx, leaseOf(again)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Keep of a released record = %v, want ErrLeaseLost", err)
	}
	if res := mustClaim(t, b.Store, claimReq("alice", rel.Key, "body")); !res.Claimed || res.Reclaimed || res.Record.Uncertain {
		t.Fatalf("claim of the released record: %+v, want a fresh claim, not Uncertain", res)
	}
}

// testLeaseDeadline: staleness is the record's own LeaseExpiresAt, set by
// the claim that took the lease from its ClaimRequest.Lease; the lease a
// later claim asks for decides nothing about the record it finds.
func testLeaseDeadline(t *testing.T, b Backend) {
	long := claimReq("alice", uniq("k"), "body")
	long.Lease = time.Hour
	res := mustClaim(t, b.Store, long)
	if d := res.Record.LeaseExpiresAt.Sub(res.Now); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("LeaseExpiresAt %v is %v after the claim's now %v, want an hour", res.Record.LeaseExpiresAt, d, res.Now)
	}
	short := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, short) // Lease
	time.Sleep(Lease + 150*time.Millisecond)

	eager := claimReq("alice", long.Key, "body")
	eager.Lease = time.Millisecond
	if res := mustClaim(t, b.Store, eager); res.Claimed {
		t.Fatal("a claim asking for a short lease took over a record whose own lease has an hour left")
	}
	patient := claimReq("alice", short.Key, "body")
	patient.Lease = time.Hour
	res = mustClaim(t, b.Store, patient)
	if !res.Claimed || !res.Reclaimed {
		t.Fatal("a claim asking for a long lease did not take over a record whose own lease ended")
	}
	if d := res.Record.LeaseExpiresAt.Sub(res.Now); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("the takeover's LeaseExpiresAt is %v after its now, want an hour", d)
	}
	if stale, err := b.Store.ListStale(ctxT(t), 1000); err != nil || holds(stale, long.Key) || holds(stale, short.Key) {
		t.Fatalf("ListStale lists a live record (%d records, %v)", len(stale), err)
	}
}

// holds reports whether recs has a record for key.
func holds(recs []idem.Record, key string) bool {
	for _, r := range recs {
		if r.Key == key {
			return true
		}
	}
	return false
}
