package storetest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
)

// PoolPinning proves that one principal cannot pin a store's connection
// pool and make every other principal queue behind it. store's
// pool must hold exactly poolSize connections, each claimed request holding
// one for its handler's run (a SQL store's transaction).
//
// On a real HTTP server, poolSize+2 of alice's requests arrive at once with
// handlers that take hold; while they run, bob sends one POST. Without a
// bound his request would wait for one of alice's handlers to end. Two
// configurations are checked:
//
//   - StoreTimeout: bob's request is answered 503 store-unavailable with a
//     Retry-After within 2*StoreTimeout (the claim's wait, then the
//     release of a claim whose answer may have been lost), not after hold;
//   - MaxInFlightPerPrincipal: alice holds at most half the pool, her
//     excess requests are answered 429 at once, and bob's POST succeeds
//     without waiting.
//
// It takes about 2*hold.
func PoolPinning(t *testing.T, store idemstore.Store, poolSize int, hold time.Duration) {
	storeTimeout := 500 * time.Millisecond
	tests := []struct {
		name       string
		cfg        idem.Config
		wantStatus int           // bob's
		within     time.Duration // bob's latency bound
	}{
		// Twice: the claim's wait, then the fenced release of a claim whose
		// answer was lost, which waits for a connection too.
		{"StoreTimeout", idem.Config{StoreTimeout: storeTimeout}, http.StatusServiceUnavailable, 2*storeTimeout + hold/3},
		{"MaxInFlightPerPrincipal", idem.Config{MaxInFlightPerPrincipal: poolSize / 2}, http.StatusCreated, hold / 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Store, cfg.FingerprintKey = store, FingerprintKey
			cfg.RequestTimeout = 4 * hold
			bob, status, alice := pinPool(t, cfg, poolSize, hold)
			t.Logf("pool %d, %d of alice's %v handlers at once: bob's POST answered %d after %v; alice's: %v",
				poolSize, poolSize+2, hold, status, bob.Round(time.Millisecond), alice)
			if status != tc.wantStatus || bob > tc.within {
				t.Fatalf("bob's POST answered %d after %v, want %d within %v", status, bob, tc.wantStatus, tc.within)
			}
		})
	}
}

// pinPool runs poolSize+2 of alice's slow requests and, while they run,
// one of bob's; it returns bob's latency and status and the count of
// alice's statuses.
func pinPool(t *testing.T, cfg idem.Config, poolSize int, hold time.Duration) (time.Duration, int, map[int]int) {
	t.Helper()
	eng, err := idem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var running atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		principal := r.Header.Get("X-Principal")
		idemadapter.HandleHTTP(eng, w, r, principal, func(r2 *http.Request, buf *idemadapter.ResponseBuffer) error {
			if principal == "alice" {
				running.Add(1)
				defer running.Add(-1)
				select {
				case <-time.After(hold):
				case <-r2.Context().Done():
				}
			}
			buf.WriteHeader(http.StatusCreated)
			return nil
		})
	}))
	defer srv.Close()
	client := &http.Client{Timeout: 4 * hold, Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: poolSize + 4}}
	defer client.CloseIdleConnections()
	post := func(principal string) (int, error) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Principal", principal)
		req.Header.Set(idem.DefaultHeader, uniq(principal))
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}

	var (
		mu    sync.Mutex
		alice = map[int]int{}
		wg    sync.WaitGroup
	)
	for range poolSize + 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, err := post("alice")
			if err != nil {
				t.Errorf("alice: %v", err)
			}
			mu.Lock()
			alice[status]++
			mu.Unlock()
		}()
	}
	// Wait until alice holds what she can: the whole pool, or her limit.
	want := int32(poolSize)
	if cfg.MaxInFlightPerPrincipal > 0 {
		want = int32(min(poolSize, cfg.MaxInFlightPerPrincipal))
	}
	deadline := time.Now().Add(hold / 2)
	for running.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of alice's handlers running, want %d", running.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	status, err := post("bob")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("bob: %v", err)
	}
	wg.Wait()
	return took, status, alice
}

// DownstreamKeyOnAFullPool proves that DownstreamKey needs no connection
// beyond the handler's own transaction: poolSize handlers, which between
// them hold every connection of store's pool, call it at once, and each
// gets its key within the engine's StoreTimeout and answers 201. A store
// whose DownstreamKey waited for a second pool connection (to make the
// claim durable) would leave every one of them waiting for the others.
// store's pool must hold exactly poolSize connections.
func DownstreamKeyOnAFullPool(t *testing.T, store idemstore.Store, poolSize int) {
	const storeTimeout = 2 * time.Second
	eng, err := idem.New(idem.Config{Store: store, FingerprintKey: FingerprintKey,
		StoreTimeout: storeTimeout, RequestTimeout: 4 * storeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	var (
		inside atomic.Int32 // handlers holding their transaction
		wg     sync.WaitGroup
		mu     sync.Mutex
		took   []time.Duration
	)
	statuses := make([]int, poolSize)
	for i := range poolSize {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := uniq("downstream")
			resp := Serve(eng, "alice", key, func(ctx context.Context) (int, []byte) {
				// Wait until every handler holds its connection, so the
				// pool is empty when they ask for their keys.
				inside.Add(1)
				for deadline := time.Now().Add(storeTimeout); inside.Load() < int32(poolSize) && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				start := time.Now()
				dk, err := idem.DownstreamKey(ctx, "charge")
				d := time.Since(start)
				mu.Lock()
				took = append(took, d)
				mu.Unlock()
				if err != nil || len(dk) != 64 {
					t.Errorf("DownstreamKey with the pool full: %q, %v after %v", dk, err, d)
					return http.StatusInternalServerError, nil
				}
				return http.StatusCreated, []byte(`{}`)
			})
			statuses[i] = resp.Status
		}()
	}
	wg.Wait()
	if n := inside.Load(); n != int32(poolSize) {
		t.Fatalf("%d of %d handlers ran; the rest could not begin their transaction", n, poolSize)
	}
	for i, s := range statuses {
		if s != http.StatusCreated {
			t.Fatalf("handler %d answered %d, want 201 (statuses %v)", i, s, statuses)
		}
	}
	for _, d := range took {
		if d > storeTimeout {
			t.Fatalf("a DownstreamKey took %v with the pool full, want at most StoreTimeout %v (all: %v)", d, storeTimeout, took)
		}
	}
	t.Logf("pool %d, %d handlers inside DownstreamKey at once: %v each", poolSize, poolSize, took)
}

// testPool runs DownstreamKeyOnAFullPool on a store whose pool holds four
// connections, and PoolPinning on one of ten when the store's handlers
// each hold a connection (Backend.HandlerHoldsConn).
func testPool(t *testing.T, b Backend) {
	if b.Pool == nil {
		t.Skip("not applicable: the store has no connection pool to empty (Backend.Pool)")
	}
	t.Run("DownstreamKeyOnAFullPool", func(t *testing.T) { DownstreamKeyOnAFullPool(t, b.Pool(t, 4), 4) })
	t.Run("PoolPinning", func(t *testing.T) {
		if !b.HandlerHoldsConn {
			t.Skip("not applicable: the store's handlers hold no pool connection (Backend.HandlerHoldsConn)")
		}
		PoolPinning(t, b.Pool(t, 10), 10, 3*time.Second)
	})
}

// testSyncer: a store that declares Backend.Syncer honours
// ClaimRequest.Durable and hands out a Tx that is an idemstore.Syncer whose Sync
// succeeds, before and after the handler's write.
func testSyncer(t *testing.T, b Backend) {
	if !b.Syncer {
		t.Skip("not applicable: the backend declares no Syncer (Backend.Syncer)")
	}
	ctx := ctxT(t)
	req := claimReq("alice", uniq("sync"), "body")
	req.Durable = true
	if res := mustClaim(t, b.Store, req); !res.Claimed {
		t.Fatal("a durable claim of a new key did not claim it")
	}
	txCtx, tx, err := b.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	syncer, ok := tx.(idemstore.Syncer)
	if !ok {
		t.Fatal("Backend.Syncer is set, but the store's Tx is no idemstore.Syncer")
	}
	if err := syncer.Sync(ctx); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if err := b.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	if err := syncer.Sync(ctx); err != nil {
		t.Fatalf("Sync after the handler's write: %v", err)
	}
	if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("synced")}); err != nil {
		t.Fatal(err)
	}
	if n := effects(t, b, req.Key); n != 1 {
		t.Fatalf("%d business writes after a synced settle, want 1", n)
	}
}

// testSyncBehindOpenWriter: with Backend.Syncer and Backend.HoldRecord,
// Sync returns soon, well within the bound below, when another session
// wrote after the claim committed and keeps its transaction open, and
// nothing else on the server commits: WAL that no commit follows is not
// flushed by the server on its own for seconds, and a Sync that waited for
// it would fail the attempt's first DownstreamKey. The case proves this
// only when run on a server where nothing else happens (as the PostgreSQL
// stores run it on pgsqltest.QuietServer); on a busy one the others'
// commits flush the WAL anyway.
func testSyncBehindOpenWriter(t *testing.T, b Backend) {
	if !b.Syncer || b.HoldRecord == nil {
		t.Skip("not applicable: the backend declares no Syncer, or cannot hold a record from outside (Backend.Syncer, Backend.HoldRecord)")
	}
	const bound = 3 * time.Second
	ctx := ctxT(t)
	other := claimReq("alice", uniq("writer"), "body")
	other.Durable = true
	mustClaim(t, b.Store, other)
	for i := range 3 {
		req := claimReq("alice", uniq("sync-behind"), "body")
		mustClaim(t, b.Store, req) // its commit does not wait for the flush
		release := b.HoldRecord(t, other.Principal, other.Key)
		txCtx, tx, err := b.Store.BeginTx(ctx, leaseOf(req))
		if err != nil {
			release()
			t.Fatal(err)
		}
		if err := b.WriteEffect(txCtx, req.Key); err != nil {
			release()
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, bound)
		start := time.Now()
		err = tx.(idemstore.Syncer).Sync(sctx)
		took := time.Since(start)
		cancel()
		_ = tx.Rollback(ctx)
		release()
		if err != nil {
			t.Fatalf("round %d: Sync behind another session's open write: %v after %v, want it within %v", i, err, took, bound)
		}
	}
}
