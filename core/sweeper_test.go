package idem_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
)

// sweepLog is a SweepObserver that sends every sweep's result on a channel.
type sweepLog chan idem.SweepResult

func (c sweepLog) ObserveSweep(_ context.Context, res idem.SweepResult, _ error) { c <- res }

// TestSweeperKeepsUpWithABacklog: a sweep that stopped at MaxBatches with
// every batch full is followed at once by the next, so the purge rate is
// the store's, not BatchSize × MaxBatches per Interval.
func TestSweeperKeepsUpWithABacklog(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	const expired = 20
	for i := range expired {
		key := "k" + strings.Repeat("x", i)
		if _, err := store.Claim(context.Background(), idemstore.ClaimRequest{Principal: "p", Key: key, Token: key,
			Lease: time.Second, Retention: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(2 * time.Minute)
	sweeps := make(sweepLog, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// An interval far longer than the test: only the backlog rule can make
	// a second sweep happen.
	s := idem.Sweeper{Store: store, BatchSize: 2, MaxBatches: 3, Interval: time.Hour, Observer: sweeps,
		Logger: slog.New(slog.DiscardHandler)}
	go func() { _ = s.Run(ctx) }()
	purged, n := 0, 0
	deadline := time.After(10 * time.Second)
	for purged < expired {
		select {
		case res := <-sweeps:
			n++
			purged += res.Purged
			if want := res.Purged == 6; res.Backlog != want {
				t.Fatalf("sweep %d purged %d with Backlog %v", n, res.Purged, res.Backlog)
			}
		case <-deadline:
			t.Fatalf("%d of %d expired records purged after %d sweeps in 10s: the backlog waited for Interval", purged, expired, n)
		}
	}
	if n != 4 || store.Len() != 0 {
		t.Fatalf("%d sweeps, %d records left; want 4 sweeps (6+6+6+2) and none left", n, store.Len())
	}
}

// TestSweeperLogsNoKey: a stale claim's log line names the key's hash, as
// the engine's does, never the key.
func TestSweeperLogsNoKey(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	const key = "order-4111111111111111"
	if _, err := store.Claim(context.Background(), idemstore.ClaimRequest{Principal: "p", Key: key, Token: "t",
		Lease: time.Second, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute)
	var mu sync.Mutex
	var buf bytes.Buffer
	sweeps := make(sweepLog, 10)
	ctx, cancel := context.WithCancel(context.Background())
	s := idem.Sweeper{Store: store, Lease: time.Second, Interval: time.Hour, Observer: sweeps,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	select {
	case <-sweeps:
	case <-time.After(10 * time.Second):
		t.Fatal("no sweep in 10s")
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if out := buf.String(); !strings.Contains(out, "stale idempotency claim") || !strings.Contains(out, "key_hash=") ||
		strings.Contains(out, "4111") {
		t.Fatalf("log = %q; want the stale claim by key_hash, without the key", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestSweeperCountsRecords: with CountRecords every sweep reports the
// store's Stats, for an in-progress gauge; without it, none.
func TestSweeperCountsRecords(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	ctx := context.Background()
	for _, k := range []string{"stale", "held"} {
		if _, err := store.Claim(ctx, idemstore.ClaimRequest{Principal: "p", Key: k, Token: k, Nonce: k,
			Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if k == "stale" {
			clk.Add(2 * time.Minute)
		}
	}
	for _, count := range []bool{false, true} {
		s := idem.Sweeper{Store: store, Lease: time.Minute, CountRecords: count}
		res, err := s.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !count && res.Stats != nil:
			t.Fatalf("Stats %+v without CountRecords", res.Stats)
		case count && (res.Stats == nil || res.Stats.InProgress != 2 || res.Stats.Stale != 1):
			t.Fatalf("Stats %+v, want 2 in progress, 1 stale", res.Stats)
		}
	}
}
