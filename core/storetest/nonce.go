package storetest

import (
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
)

// testNonce: a claim that inserts a record stores its request's nonce; a
// claim that finds the record live returns the stored nonce; a takeover of
// a stale claim keeps it, and so does the settle; a claim that replaces an
// expired record stores the new request's. The engine derives
// DownstreamKey from it, so a takeover resends the crashed attempt's
// provider keys and a new record sends new ones. A store that keeps no
// nonce (Backend.NoNonce) must return an empty one everywhere.
func testNonce(t *testing.T, b Backend) {
	ctx := ctxT(t)
	check := func(what string, got idem.Record, want string) {
		t.Helper()
		want = storedNonce(b, want)
		if got.Nonce != want {
			t.Fatalf("%s: nonce %q, want %q", what, got.Nonce, want)
		}
		rec, err := b.Store.Get(ctx, got.Principal, got.Key)
		if err != nil {
			t.Fatalf("%s: Get: %v", what, err)
		}
		if rec.Nonce != want {
			t.Fatalf("%s: stored nonce %q, want %q", what, rec.Nonce, want)
		}
	}
	first := claimReq("alice", uniq("k"), "body")
	res := mustClaim(t, b.Store, first)
	if !res.Claimed {
		t.Fatal("first claim did not claim")
	}
	check("fresh claim", res.Record, first.Nonce)
	if live := mustClaim(t, b.Store, claimReq("alice", first.Key, "body")); live.Claimed {
		t.Fatal("a live lease was taken over")
	} else {
		check("claim of a live record", live.Record, first.Nonce)
	}

	time.Sleep(Lease + 150*time.Millisecond)
	takeover := claimReq("alice", first.Key, "body")
	takeover.Retention = Lease
	res = mustClaim(t, b.Store, takeover)
	if !res.Reclaimed {
		t.Fatal("claim after the lease did not take the record over")
	}
	check("takeover", res.Record, first.Nonce)
	if err := settleWithEffect(ctx, b, leaseOf(takeover), first.Key, okResponse("taken-over")); err != nil {
		t.Fatal(err)
	}
	rec, err := b.Store.Get(ctx, "alice", first.Key)
	if err != nil {
		t.Fatal(err)
	}
	check("settled takeover", rec, first.Nonce)

	time.Sleep(Lease + 150*time.Millisecond)
	again := claimReq("alice", first.Key, "body")
	res = mustClaim(t, b.Store, again)
	if !res.Claimed || res.Reclaimed {
		t.Fatalf("claim of an expired record: Claimed=%v Reclaimed=%v, want a fresh claim", res.Claimed, res.Reclaimed)
	}
	if again.Nonce == first.Nonce {
		t.Fatal("claimReq made the same nonce twice")
	}
	check("re-claim after expiry", res.Record, again.Nonce)
}

// storedNonce is the nonce b's store keeps for a claim that sent nonce:
// nonce itself, or "" for a store that keeps none (Backend.NoNonce).
func storedNonce(b Backend, nonce string) string {
	if b.NoNonce {
		return ""
	}
	return nonce
}
