package memstore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
)

// fill claims n live records for n principals of its own (so no
// principal's share is the bound), each with its own retention: record i
// expires at start + (i+1)*step.
func fill(b testing.TB, s *memstore.Store, n int, step time.Duration) {
	b.Helper()
	for i := range n {
		key := strconv.Itoa(i)
		if _, err := s.Claim(context.Background(), idemstore.ClaimRequest{Principal: "p" + key, Key: key, Token: key, Nonce: key,
			Lease: time.Minute, Retention: time.Duration(i+1) * step}); err != nil {
			b.Fatalf("fill %d: %v", i, err)
		}
	}
}

// BenchmarkClaimWhenFull: a claim on a store at its record bound, nothing
// expired: refused with ErrFull, without reading every record to look for
// an expired one.
func BenchmarkClaimWhenFull(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			s := memstore.MustNew(memstore.WithMaxRecords(n), memstore.WithPrincipalShare(1))
			fill(b, s, n, time.Hour)
			i := 0
			for b.Loop() {
				i++
				_, err := s.Claim(context.Background(), idemstore.ClaimRequest{Principal: "new", Key: strconv.Itoa(i), Token: "t", Nonce: "n",
					Lease: time.Minute, Retention: time.Hour})
				if !errors.Is(err, memstore.ErrFull) {
					b.Fatalf("claim on a full store: %v, want ErrFull", err)
				}
			}
		})
	}
}

// TestFullStoreEvictsInExpiryOrder: a full store makes room by evicting
// the records that have expired, those only, the soonest expired first,
// however many live records it holds.
func TestFullStoreEvictsInExpiryOrder(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_750_000_000, 0)
	s := memstore.MustNew(memstore.WithMaxRecords(100), memstore.WithPrincipalShare(1), memstore.WithClock(func() time.Time { return now }))
	fill(t, s, 100, time.Second) // record i expires at +(i+1)s
	claim := func(key string) error {
		_, err := s.Claim(context.Background(), idemstore.ClaimRequest{Principal: "new", Key: key, Token: key, Nonce: key,
			Lease: time.Minute, Retention: time.Hour})
		return err
	}
	if err := claim("a"); !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("claim on a full store with nothing expired: %v, want ErrFull", err)
	}
	now = now.Add(3 * time.Second) // records 0, 1 and 2 have expired
	for _, k := range []string{"a", "b", "c"} {
		if err := claim(k); err != nil {
			t.Fatalf("claim %s with expired records to evict: %v", k, err)
		}
	}
	if err := claim("d"); !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("a fourth claim with three records expired: %v, want ErrFull", err)
	}
	for i, want := range map[int]bool{0: false, 1: false, 2: false, 3: true, 99: true} {
		_, err := s.Get(context.Background(), "p"+strconv.Itoa(i), strconv.Itoa(i))
		if got := err == nil; got != want {
			t.Errorf("record %d kept %v, want %v", i, got, want)
		}
	}
	// A record replaced with a later expiry is not evicted at its old one.
	now = now.Add(time.Second) // record 3 has expired: claimed again, it lives an hour
	if _, err := s.Claim(context.Background(), idemstore.ClaimRequest{Principal: "p3", Key: "3", Token: "again", Nonce: "again",
		Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second) // record 4 expires now; 3 no longer does
	if err := claim("d"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "p3", "3"); err != nil {
		t.Fatalf("the record claimed again was evicted at its old expiry: %v", err)
	}
	if _, err := s.Get(context.Background(), "p4", "4"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("record 4, expired, is still there: %v", err)
	}
}

// TestExpiryQueueBounded: a key claimed, released and claimed again, each
// time with a later expiry, leaves a place in the expiry queue each time;
// the queue stays within twice the records plus a slack, and a full store
// still evicts in expiry order afterwards.
func TestExpiryQueueBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_750_000_000, 0)
	s := memstore.MustNew(memstore.WithMaxRecords(100), memstore.WithPrincipalShare(1), memstore.WithClock(func() time.Time { return now }))
	fill(t, s, 50, time.Second) // record i expires at +(i+1)s
	maxQueue := 0
	for i := range 20_000 {
		now = now.Add(time.Microsecond)
		tok := strconv.Itoa(i)
		res, err := s.Claim(context.Background(), idemstore.ClaimRequest{Principal: "churn", Key: "k", Token: tok, Nonce: "n",
			Lease: time.Minute, Retention: time.Hour})
		if err != nil || !res.Claimed {
			t.Fatalf("claim %d: %+v %v", i, res, err)
		}
		if err := s.Release(context.Background(), idemstore.Lease{Principal: "churn", Key: "k", Token: tok}); err != nil {
			t.Fatal(err)
		}
		maxQueue = max(maxQueue, s.QueueLen())
	}
	if bound := 2*s.Len() + 1024; maxQueue > bound {
		t.Fatalf("the expiry queue reached %d places for %d records, more than %d", maxQueue, s.Len(), bound)
	}
	now = now.Add(3 * time.Second) // records 0, 1 and 2 have expired
	for i := range 49 + 3 {        // 49 free places, then the three expired records
		if _, err := s.Claim(context.Background(), idemstore.ClaimRequest{Principal: "new", Key: strconv.Itoa(i), Token: "t", Nonce: "n",
			Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatalf("claim %d with room or expired records to evict: %v", i, err)
		}
	}
	if _, err := s.Claim(context.Background(), idemstore.ClaimRequest{Principal: "new", Key: "x", Token: "t", Nonce: "n",
		Lease: time.Minute, Retention: time.Hour}); !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("a claim with nothing more expired: %v, want ErrFull", err)
	}
	for i, want := range map[int]bool{0: false, 1: false, 2: false, 3: true, 49: true} {
		if _, err := s.Get(context.Background(), "p"+strconv.Itoa(i), strconv.Itoa(i)); (err == nil) != want {
			t.Errorf("record %d kept %v, want %v", i, err == nil, want)
		}
	}
}
