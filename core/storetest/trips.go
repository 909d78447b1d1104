package storetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// testRoundTrips measures every Store call with Backend.CountTrips against
// Backend.Trips: each call runs three times on keys of its own, the first
// two warming the connection, and the last must cost what Trips says; then a request
// through the engine whose handler runs nothing costs Claim+Begin+Settle,
// its replay Replay.
func testRoundTrips(t *testing.T, b Backend) {
	if b.CountTrips == nil {
		t.Skip("not applicable: the store has no server to count round trips to (Backend.CountTrips)")
	}
	cb, trips := b.CountTrips(t)
	s, want := cb.Store, b.Trips
	ctx := ctxT(t)
	// measure runs prepare and fn three times and checks what the last fn
	// alone costs: the first two warm the connections (a store may send
	// one statement on a connection's first transaction and another once
	// a settle committed on it).
	measure := func(name string, want int, prepare, fn func() error) {
		t.Helper()
		for pass := range 3 {
			if err := prepare(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			before := trips()
			if err := fn(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			switch got := trips() - before; {
			case pass < 2:
			case got != int64(want):
				t.Errorf("%s: %d round trips, want %d", name, got, want)
			default:
				t.Logf("%-8s %d round trip(s)", name, got)
			}
		}
	}
	var (
		req idemstore.ClaimRequest
		tx  idemstore.Tx
	)
	claim := func(lease time.Duration) func() error {
		return func() error {
			req = claimReq("alice", uniq("trip"), "body")
			req.Lease = lease
			res, err := s.Claim(ctx, req)
			if err == nil && !res.Claimed {
				err = errors.New("not claimed")
			}
			return err
		}
	}
	none := func() error { return nil }
	measure("Claim", want.Claim, none, claim(time.Hour))
	measure("Conflict", want.Conflict, claim(time.Hour), func() error {
		if res, err := s.Claim(ctx, claimReq("alice", req.Key, "body")); err != nil || res.Claimed {
			return fmt.Errorf("claim of a held key: %+v, %v", res, err)
		}
		return nil
	})
	measure("Begin", want.Begin, func() error {
		if tx != nil {
			_ = tx.Rollback(ctx) // the connection goes back before the next claim
		}
		return claim(time.Hour)()
	}, func() (err error) {
		_, tx, err = s.BeginTx(ctx, leaseOf(req))
		return err
	})
	_ = tx.Rollback(ctx)
	measure("Settle", want.Settle, func() (err error) {
		if err = claim(time.Hour)(); err == nil {
			_, tx, err = s.BeginTx(ctx, leaseOf(req))
		}
		return err
	}, func() error {
		return tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("trip")})
	})
	measure("Rollback", 0, func() (err error) {
		if err = claim(time.Hour)(); err == nil {
			_, tx, err = s.BeginTx(ctx, leaseOf(req))
		}
		if err == nil {
			err = tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("trip")})
		}
		return err
	}, func() error { return tx.Rollback(ctx) }) // after Settle: nothing to send
	measure("Replay", want.Replay, none, func() error {
		if res, err := s.Claim(ctx, claimReq("alice", req.Key, "body")); err != nil || res.Claimed || res.Record.Response == nil {
			return fmt.Errorf("replay: %+v, %v", res, err)
		}
		return nil
	})
	measure("Get", want.Get, none, func() error { _, err := s.Get(ctx, "alice", req.Key); return err })
	measure("Release", want.Release, claim(time.Hour), func() error { return s.Release(ctx, leaseOf(req)) })
	measure("Keep", want.Keep, claim(time.Hour), func() error { return s.Keep(ctx, leaseOf(req)) })
	measure("Takeover", want.Takeover, func() error {
		err := claim(time.Millisecond)()
		time.Sleep(5 * time.Millisecond)
		return err
	}, func() error {
		if res, err := s.Claim(ctx, claimReq("alice", req.Key, "body")); err != nil || !res.Reclaimed {
			return fmt.Errorf("takeover: %+v, %v", res, err)
		}
		return nil
	})
	if b.Syncer {
		measure("Durable", want.DurableClaim, none, func() error {
			r := claimReq("alice", uniq("trip"), "body")
			r.Durable = true
			if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
				return fmt.Errorf("durable claim: %+v, %v", res, err)
			}
			return nil
		})
	}
	// A subscribed Notifier publishes in what settle and release send
	// anyway.
	if n, ok := s.(idemstore.Notifier); ok && b.Peer != nil {
		stop, err := n.Subscribe(func(string) {})
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		measure("Settle (subscribed)", want.Settle, func() (err error) {
			if err = claim(time.Hour)(); err == nil {
				_, tx, err = s.BeginTx(ctx, leaseOf(req))
			}
			return err
		}, func() error {
			return tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("trip")})
		})
		measure("Release (subscribed)", want.Release, claim(time.Hour), func() error { return s.Release(ctx, leaseOf(req)) })
		stop()
	}

	eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey, Store: s})
	if err != nil {
		t.Fatal(err)
	}
	key := uniq("trip-engine")
	for i, want := range []int{want.Claim + want.Begin + want.Settle, want.Replay} {
		before := trips()
		resp := Serve(eng, "alice", key, func(context.Context) (int, []byte) { return http.StatusCreated, []byte(`{}`) })
		if got := trips() - before; resp.Status != http.StatusCreated || got != int64(want) {
			t.Errorf("engine request %d: answered %d in %d round trips, want 201 in %d", i, resp.Status, got, want)
		}
	}
}

// testReplayWritesNothing counts the server's writes with
// Backend.CountWrites: what only reads a record (a replay, a claim of a
// held key, a claim with another fingerprint, Get, ListStale) writes
// nothing; claims and a settle do, which shows the count sees writes.
func testReplayWritesNothing(t *testing.T, b Backend) {
	if b.CountWrites == nil {
		t.Skip("not applicable: the store's writes cannot be counted apart from other clients' (Backend.CountWrites)")
	}
	cb, writes := b.CountWrites(t)
	ctx := ctxT(t)
	held, done := claimReq("alice", uniq("held"), "body"), claimReq("alice", uniq("done"), "body")
	held.Lease = time.Hour
	before := writes()
	mustClaim(t, cb.Store, held)
	mustClaim(t, cb.Store, done)
	if err := settle(ctx, cb, leaseOf(done), idemstore.StateCompleted, okResponse("done")); err != nil {
		t.Fatal(err)
	}
	if writes() == before {
		t.Fatal("two claims and a settle counted no write: the count does not see writes")
	}
	before = writes()
	const n = 100
	for i := range n {
		key := done.Key
		if i%2 == 1 {
			key = held.Key
		}
		if res := mustClaim(t, cb.Store, claimReq("alice", key, "body")); res.Claimed {
			t.Fatalf("claim %d of an existing key claimed it", i)
		}
		get(t, cb, "alice", key)
	}
	if res := mustClaim(t, cb.Store, claimReq("alice", held.Key, "another body")); res.Claimed {
		t.Fatal("a claim with another fingerprint claimed a held key")
	}
	if _, err := cb.Store.ListStale(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if d := writes() - before; d != 0 {
		t.Fatalf("%d replays and claims of a held key, a mismatch and a ListStale wrote %d times, want 0", n, d)
	}
}
