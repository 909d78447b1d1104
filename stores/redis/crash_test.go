package idemredis_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestCrashBetweenBusinessCommitAndSettle is the first row of the failure
// table: the handler committed its payment, then the process died before
// the settle. The record stays in progress (409 with Retry-After) until
// the lease expires; then a retry takes it over, and Reconcile finds the
// payment by its downstream key and stores that answer. Without Reconcile
// the handler runs again and the unique column turns its insert into a
// read of the same row. Either way: one payment, one answer.
func TestCrashBetweenBusinessCommitAndSettle(t *testing.T) {
	for _, withReconcile := range []bool{true, false} {
		name := map[bool]string{true: "Reconcile", false: "HandlerAgain"}[withReconcile]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t)
			db := newPaymentsDB()
			cfg := idem.Config{FingerprintKey: storetest.FingerprintKey, Store: env.Store, RequestTimeout: 300 * time.Millisecond,
				StoreTimeout: 200 * time.Millisecond, Lease: 800 * time.Millisecond}
			if withReconcile {
				cfg.Reconcile = reconcileFrom(db)
			}
			eng, err := idem.New(cfg)
			mustNil(t, err)
			var wg sync.WaitGroup
			for i := range 5 {
				wg.Go(func() {
					key := "crash-" + idemredistest.RandHex(4)
					// The first attempt commits its payment and dies: no
					// Finish, no Abort, no settle, no release.
					att, resp := eng.Begin(context.Background(), idem.Request{Method: "POST", Path: "/payments",
						Principal: "alice", Key: key, ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`)})
					if att == nil {
						t.Errorf("key %d: first attempt not claimed: %d", i, resp.Status)
						return
					}
					_, first := paymentHandler(db, key)(att.Context())
					if r := run(eng, "alice", key, paymentHandler(db, key)); r.Status != http.StatusConflict || r.Header.Get("Retry-After") == "" {
						t.Errorf("key %d: retry while the crashed holder's lease runs answered %d %v", i, r.Status, r.Header)
						return
					}
					time.Sleep(cfg.Lease + 100*time.Millisecond)
					var last *idem.Response
					for range 2 {
						last = run(eng, "alice", key, paymentHandler(db, key))
						if last.Status != http.StatusCreated || !bytes.Equal(last.Body, first) {
							t.Errorf("key %d: retry after the lease answered %d %s, want 201 %s", i, last.Status, last.Body, first)
							return
						}
					}
					if last.Header.Get(idem.ReplayedHeader) != "true" {
						t.Errorf("key %d: the second retry was not a replay", i)
					}
					if n := db.rowsFor(key); n != 1 {
						t.Errorf("key %d: %d payments, want 1", i, n)
					}
				})
			}
			wg.Wait()
			t.Logf("%s: 5 crashed holders, each key: 409 during the lease, then one payment and one answer; %d inserts absorbed by the unique column",
				name, db.conflicts.Load())
		})
	}
}

// TestFailoverToReplicaThatMissedTheClaim is the third row of the failure
// table, played with two servers of the test's own behind one client whose
// dialer follows "the primary", as a Sentinel failover client does: the
// first attempt claims on A and is still running when A dies and B, a
// replica that had not received the claim, takes over as primary. The
// client's retry claims the key on B and completes; the first attempt then
// commits its payment, meets the row the second wrote (the unique column),
// and its settle on B misses the fence (409 lease lost). One payment; the
// key replays it.
func TestFailoverToReplicaThatMissedTheClaim(t *testing.T) {
	a, b := startServer(t), startServer(t)
	var primary atomic.Value
	primary.Store(a.addr())
	c := redis.NewClient(&redis.Options{
		Addr: "primary", MaxRetries: 3,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, primary.Load().(string))
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	env := idemredistest.NewEnv(t, c)
	db := newPaymentsDB()
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: env.Store, RequestTimeout: 5 * time.Second, StoreTimeout: time.Second,
		Lease: 7 * time.Second, Reconcile: reconcileFrom(db)})
	mustNil(t, err)

	key := "failover-" + idemredistest.RandHex(4)
	inHandler, failedOver := make(chan struct{}), make(chan struct{})
	var first *idem.Response
	done := make(chan struct{})
	go func() {
		defer close(done)
		first = run(eng, "alice", key, func(ctx context.Context) (int, []byte) {
			close(inHandler)
			<-failedOver
			return paymentHandler(db, key)(ctx)
		})
	}()
	<-inHandler
	a.kill()
	primary.Store(b.addr())
	second := run(eng, "alice", key, paymentHandler(db, key))
	close(failedOver)
	<-done
	if second.Status != http.StatusCreated {
		t.Fatalf("the retry on the new primary answered %d %s", second.Status, second.Body)
	}
	if first.Status != http.StatusConflict || !bytes.Contains(first.Body, []byte(idem.ProblemLeaseLost)) {
		t.Fatalf("the first attempt, after the failover, answered %d %s; want 409 lease lost", first.Status, first.Body)
	}
	if n := db.rowsFor(key); n != 1 {
		t.Fatalf("%d payments after the failover, want 1", n)
	}
	replay := run(eng, "alice", key, paymentHandler(db, key))
	if replay.Status != http.StatusCreated || !bytes.Equal(replay.Body, second.Body) || replay.Header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("replay after the failover: %d %s", replay.Status, replay.Body)
	}
	t.Logf("two holders across the failover: 1 payment (%d insert absorbed by the unique column); the stale holder got 409 lease lost; the key replays %s",
		db.conflicts.Load(), second.Body)
}
