package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// testTakeoverRacingSettle: a holder whose lease ends at once settles
// while another request takes its claim over, the settle first, the
// takeover first, or both at the same moment. Exactly one of them stores
// its outcome, the holder's settle fails with ErrLeaseLost exactly when
// the taker's outcome stands, and only that one's business write commits.
func testTakeoverRacingSettle(t *testing.T, b Backend) {
	if b.SingleWriter {
		t.Skip("not applicable: on a single-writer database the holder's open write blocks the takeover (Backend.SingleWriter)")
	}
	ctx := ctxT(t)
	n := max(rounds(b)/4, 12)
	var holderWins, takerWins int
	for i := range n {
		key := uniq("race")
		holder := claimReq("alice", key, "body")
		holder.Lease = time.Millisecond
		mustClaim(t, b.Store, holder)
		txCtx, tx, err := b.Store.BeginTx(ctx, leaseOf(holder))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.WriteEffect(txCtx, key+"/holder"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // the holder's lease has ended
		settled := make(chan error, 1)
		settle := func() {
			settled <- tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("holder")})
		}
		taker := claimReq("alice", key, "body")
		taker.Lease = time.Hour
		take := func() error {
			res, err := b.Store.Claim(ctx, taker)
			if err != nil {
				return err
			}
			if !res.Claimed {
				if res.Record.State != idemstore.StateCompleted || !bytes.Equal(res.Record.Response.Body, okResponse("holder").Body) {
					return fmt.Errorf("not claimed, yet the record is %+v, not the holder's outcome", res.Record)
				}
				return nil
			}
			if !res.Reclaimed {
				return errors.New("the takeover is not marked Reclaimed")
			}
			return settleWithEffect(ctx, b, leaseOf(taker), key+"/taker", okResponse("taker"))
		}
		var takeErr, settleErr error
		switch i % 3 {
		case 0:
			settle()
			settleErr = <-settled
			takeErr = take()
		case 1:
			takeErr = take()
			settle()
			settleErr = <-settled
		default:
			go settle()
			takeErr = take()
			settleErr = <-settled
		}
		_ = tx.Rollback(ctx)
		if takeErr != nil && !errors.Is(takeErr, idemstore.ErrTransient) {
			t.Fatalf("round %d: taker: %v", i, takeErr)
		}
		if settleErr != nil && !errors.Is(settleErr, idemstore.ErrLeaseLost) {
			t.Fatalf("round %d: holder's settle: %v", i, settleErr)
		}
		rec := get(t, b, "alice", key)
		if takeErr != nil {
			continue // the taker's claim failed transiently: nothing to compare
		}
		want := "holder"
		if settleErr != nil {
			want = "taker"
			takerWins++
		} else {
			holderWins++
		}
		if rec.State != idemstore.StateCompleted || !bytes.Equal(rec.Response.Body, okResponse(want).Body) {
			t.Fatalf("round %d (order %d): record %s %s, want the %s's outcome (holder's settle: %v)", i, i%3, rec.State, rec.Response.Body, want, settleErr)
		}
		h, tk := effects(t, b, key+"/holder"), effects(t, b, key+"/taker")
		switch {
		case want == "taker" && tk != 1:
			t.Fatalf("round %d: the taker's outcome stands with %d of its writes", i, tk)
		case want == "holder" && (h != 1 || tk != 0):
			t.Fatalf("round %d: the holder's outcome stands with holder writes %d, taker writes %d", i, h, tk)
		case want == "taker" && h != 0 && !b.NoSharedTx:
			t.Fatalf("round %d: the holder lost its lease, yet its write committed", i)
		}
	}
	t.Logf("%d rounds: the holder's settle won %d, the takeover %d, never both", n, holderWins, takerWins)
}

// testPurgeRacingReplacement: purgers delete expired records while
// requests claim the same expired keys again. A purge never deletes a
// record a claim has just replaced, so every claim is a fresh one that
// settles, and every key ends with its new outcome and one effect.
func testPurgeRacingReplacement(t *testing.T, b Backend) {
	ctx := ctxT(t)
	const keys = 60
	prefix := uniq("exp")
	for i := range keys {
		req := claimReq("alice", fmt.Sprintf("%s-%03d", prefix, i), "old")
		req.Retention = Lease
		mustClaim(t, b.Store, req)
		if err := settle(ctx, b, leaseOf(req), idemstore.StateCompleted, okResponse("old")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(Lease + 150*time.Millisecond)

	var wg sync.WaitGroup
	var purged atomic.Int64
	for range 2 {
		wg.Go(func() {
			for range 1000 {
				n, err := b.Store.PurgeExpired(ctx, 3)
				if err != nil && !errors.Is(err, idemstore.ErrTransient) {
					t.Errorf("purge: %v", err)
					return
				}
				purged.Add(int64(n))
				if err == nil && n == 0 {
					return
				}
			}
		})
	}
	// The purgers go oldest first; the claimers start from the other
	// end, so they meet somewhere in the middle.
	work := make(chan int, keys)
	for i := keys - 1; i >= 0; i-- {
		work <- i
	}
	close(work)
	for range 4 {
		wg.Go(func() {
			for i := range work {
				key := fmt.Sprintf("%s-%03d", prefix, i)
				req := claimReq("alice", key, "new")
				res, err := b.Store.Claim(ctx, req)
				if err != nil || !res.Claimed || res.Reclaimed {
					t.Errorf("%s: claim of an expired key: %+v %v", key, res, err)
					continue
				}
				if err := settleWithEffect(ctx, b, leaseOf(req), key, okResponse("new")); err != nil {
					t.Errorf("%s: settle after replacing an expired record: %v", key, err)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i := range keys {
		key := fmt.Sprintf("%s-%03d", prefix, i)
		if rec := get(t, b, "alice", key); rec.State != idemstore.StateCompleted || !bytes.Equal(rec.Response.Body, okResponse("new").Body) {
			t.Fatalf("%s: record %s %s after the race, want the new outcome", key, rec.State, rec.Response.Body)
		}
		if n := effects(t, b, key); n != 1 {
			t.Fatalf("%s: %d effects, want 1", key, n)
		}
	}
	t.Logf("%d expired keys claimed again while two purgers deleted %d records", keys, purged.Load())
}
