package storetest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/internal/hooks"
)

// waitBound is the WaitInFlight of the wait cases: long enough that a
// waiter answered well within it was woken, not timed out.
const waitBound = 5 * time.Second

// waitEngine returns an engine over store whose requests wait up to bound
// for their key's holder, and the recorder of its events.
func waitEngine(t testing.TB, store idemstore.Store, cfg idem.Config) (*idem.Engine, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg.Store, cfg.FingerprintKey, cfg.Observer = store, FingerprintKey, rec
	if cfg.WaitInFlight == 0 {
		cfg.WaitInFlight = waitBound
	}
	eng, err := idem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	return eng, rec
}

// holder starts a request on key through eng whose handler blocks until
// the returned end is called with the status to answer, then writes the
// business effect. It returns once the handler runs.
func holder(t *testing.T, b Backend, eng *idem.Engine, key string) (end func(status int) *idem.Response) {
	t.Helper()
	inside, result := make(chan struct{}), make(chan int)
	done := make(chan *idem.Response, 1)
	go func() {
		done <- ServeContext(context.Background(), eng, "alice", key, func(ctx context.Context) (int, []byte) {
			close(inside)
			status := <-result
			// Written once the holder is let go: on a database with one
			// writer (SQLite) an earlier write would hold its lock, and
			// every waiter's claim would wait for it in the database.
			if err := b.WriteEffect(ctx, key); err != nil {
				t.Errorf("the holder's effect: %v", err)
			}
			return status, fmt.Appendf(nil, `{"id":%q,"by":"holder"}`, key)
		})
	}()
	select {
	case <-inside:
	case resp := <-done:
		t.Fatalf("the holder did not run: %d %s", resp.Status, resp.Body)
	case <-time.After(30 * time.Second):
		t.Fatal("the holder's handler did not start")
	}
	var once sync.Once
	var resp *idem.Response
	end = func(status int) *idem.Response {
		once.Do(func() { result <- status; resp = <-done })
		return resp
	}
	t.Cleanup(func() { end(http.StatusServiceUnavailable) })
	return end
}

// waitResult is what one waiter got, and when.
type waitResult struct {
	resp *idem.Response
	took time.Duration
	ran  bool
}

// waiters starts n requests on key through eng with ctx and returns once
// every one of them waits; collect returns their answers. A waiter whose
// handler runs writes the business effect and answers 201.
func waiters(t *testing.T, b Backend, ctx context.Context, eng *idem.Engine, key string, n int) (collect func() []waitResult) {
	t.Helper()
	var waiting sync.WaitGroup
	waiting.Add(n)
	var left atomic.Int32
	left.Store(int32(n))
	wctx := hooks.WithWaiting(ctx, func() { waiting.Done(); left.Add(-1) })
	results := make([]waitResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			var ran bool
			resp := ServeContext(wctx, eng, "alice", key, func(ctx context.Context) (int, []byte) {
				ran = true
				if err := b.WriteEffect(ctx, key); err != nil {
					t.Errorf("a waiter's effect: %v", err)
				}
				return http.StatusCreated, fmt.Appendf(nil, `{"id":%q,"by":"waiter"}`, key)
			})
			results[i] = waitResult{resp: resp, took: time.Since(start), ran: ran}
		}()
	}
	all := make(chan struct{})
	go func() { waiting.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d of %d waiters did not begin to wait", left.Load(), n)
	}
	return func() []waitResult { wg.Wait(); return results }
}

// testWaitInFlight: a request whose key is held by an attempt in flight
// waits for it (Config.WaitInFlight) and gets what a later retry would.
func testWaitInFlight(t *testing.T, b Backend) {
	t.Run("WokenBySettle", func(t *testing.T) { testWaitSettle(t, b) })
	t.Run("WokenByRelease", func(t *testing.T) { testWaitRelease(t, b) })
	t.Run("Bound", func(t *testing.T) { testWaitBound(t, b) })
	t.Run("ClientGone", func(t *testing.T) { testWaitCancelled(t, b) })
	t.Run("Caps", func(t *testing.T) { testWaitCaps(t, b) })
	t.Run("OtherInstance", func(t *testing.T) { testWaitOtherInstance(t, b, true) })
	t.Run("OtherInstanceNotified", func(t *testing.T) {
		if _, ok := b.Store.(idemstore.Notifier); !ok {
			t.Skip("not applicable: the store is not an idemstore.Notifier; waiters on other instances poll (OtherInstance)")
		}
		testWaitOtherInstance(t, b, false)
	})
	t.Run("HoldsNoConnection", func(t *testing.T) { testWaitHoldsNoConn(t, b) })
}

// checkReplays fails t unless every result is the holder's response
// replayed, byte for byte, with Idempotent-Replayed: true, well within the
// bound.
func checkReplays(t *testing.T, first *idem.Response, results []waitResult) {
	t.Helper()
	for i, r := range results {
		switch {
		case r.ran:
			t.Errorf("waiter %d ran the handler; want a replay", i)
		case r.resp.Status != first.Status || !bytes.Equal(r.resp.Body, first.Body):
			t.Errorf("waiter %d got %d %s, want the holder's %d %s", i, r.resp.Status, r.resp.Body, first.Status, first.Body)
		case r.resp.Header.Get(idem.ReplayedHeader) != "true":
			t.Errorf("waiter %d: %s = %q, want true", i, idem.ReplayedHeader, r.resp.Header.Get(idem.ReplayedHeader))
		case r.resp.Header.Get("Content-Type") != first.Header.Get("Content-Type"):
			t.Errorf("waiter %d: Content-Type %q, want %q", i, r.resp.Header.Get("Content-Type"), first.Header.Get("Content-Type"))
		case r.took >= waitBound:
			t.Errorf("waiter %d answered after %v, at the bound %v: it was not woken", i, r.took, waitBound)
		}
	}
}

// countWaits returns how many of rec's events ended their wait with each
// outcome.
func countWaits(rec *recorder) map[idem.WaitOutcome]int {
	n := map[idem.WaitOutcome]int{}
	for _, ev := range rec.all() {
		if ev.Wait != "" {
			n[ev.Wait]++
		}
	}
	return n
}

// testWaitSettle: waiters on the holder's own engine are woken by its
// settle alone (they do not poll) and replay its response.
func testWaitSettle(t *testing.T, b Backend) {
	eng, rec := waitEngine(t, b.Store, idem.Config{})
	key := uniq("wait-settle")
	end := holder(t, b, eng, key)
	collect := waiters(t, b, hooks.WithoutPolling(context.Background()), eng, key, 5)
	first := end(http.StatusCreated)
	if first.Status != http.StatusCreated {
		t.Fatalf("the holder answered %d %s", first.Status, first.Body)
	}
	checkReplays(t, first, collect())
	if n := effects(t, b, key); n != 1 {
		t.Fatalf("%d business writes, want 1", n)
	}
	if n := countWaits(rec); n[idem.WaitReplayed] != 5 {
		t.Fatalf("wait outcomes %v, want 5 %s", n, idem.WaitReplayed)
	}
}

// testWaitRelease: when the holder releases the key, exactly one waiter
// claims it and runs, once, and the others replay that one's response.
func testWaitRelease(t *testing.T, b Backend) {
	eng, rec := waitEngine(t, b.Store, idem.Config{})
	key := uniq("wait-release")
	end := holder(t, b, eng, key)
	collect := waiters(t, b, context.Background(), eng, key, 5)
	if resp := end(http.StatusServiceUnavailable); resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("the releasing holder answered %d %s", resp.Status, resp.Body)
	}
	results := collect()
	var runner *idem.Response
	var replays []waitResult
	for _, r := range results {
		if r.ran {
			if runner != nil {
				t.Fatal("two waiters ran the handler after the release")
			}
			runner = r.resp
			continue
		}
		replays = append(replays, r)
	}
	if runner == nil || runner.Status != http.StatusCreated {
		t.Fatalf("no waiter claimed the released key and ran (results %+v)", results)
	}
	checkReplays(t, runner, replays)
	if n := effects(t, b, key); n != 1 && !b.NoSharedTx {
		t.Fatalf("%d business writes, want 1: the released holder's rolled back and one waiter's", n)
	}
	if n := countWaits(rec); n[idem.WaitClaimedAfterRelease] != 1 || n[idem.WaitReplayed] != 4 {
		t.Fatalf("wait outcomes %v, want 1 %s and 4 %s", n, idem.WaitClaimedAfterRelease, idem.WaitReplayed)
	}
}

// testWaitBound: a holder still in flight at the bound leaves its waiter
// the 409 with Retry-After, at the bound.
func testWaitBound(t *testing.T, b Backend) {
	const bound = 300 * time.Millisecond
	eng, rec := waitEngine(t, b.Store, idem.Config{WaitInFlight: bound})
	key := uniq("wait-bound")
	end := holder(t, b, eng, key)
	// The holder settles well after the bound: a waiter that ignored the
	// bound would get its replay instead of the 409.
	time.AfterFunc(bound+2*time.Second, func() { end(http.StatusCreated) })
	collect := waiters(t, b, context.Background(), eng, key, 1)
	r := collect()[0]
	switch {
	case r.resp.Status != http.StatusConflict || r.resp.Header.Get("Retry-After") == "":
		t.Fatalf("at the bound the waiter got %d %v %s, want 409 with Retry-After", r.resp.Status, r.resp.Header, r.resp.Body)
	case r.took < bound || r.took > bound+time.Second:
		t.Fatalf("the waiter was answered after %v, want at the bound %v", r.took, bound)
	}
	if n := countWaits(rec); n[idem.WaitTimedOut] != 1 {
		t.Fatalf("wait outcomes %v, want 1 %s", n, idem.WaitTimedOut)
	}
}

// testWaitCancelled: a client that goes away ends its wait at once.
func testWaitCancelled(t *testing.T, b Backend) {
	eng, rec := waitEngine(t, b.Store, idem.Config{})
	key := uniq("wait-gone")
	end := holder(t, b, eng, key)
	defer end(http.StatusCreated)
	ctx, cancel := context.WithCancel(context.Background())
	collect := waiters(t, b, ctx, eng, key, 3)
	cancel()
	for i, r := range collect() {
		if r.resp.Status != http.StatusConflict || r.took > waitBound/2 {
			t.Errorf("waiter %d, its client gone, got %d after %v; want 409 long before the bound %v", i, r.resp.Status, r.took, waitBound)
		}
	}
	if n := countWaits(rec); n[idem.WaitCancelled] != 3 {
		t.Fatalf("wait outcomes %v, want 3 %s", n, idem.WaitCancelled)
	}
}

// testWaitCaps: past MaxWaiters, or MaxWaitersPerPrincipal, a request is
// answered 409 with Retry-After at once instead of waiting.
func testWaitCaps(t *testing.T, b Backend) {
	for _, tc := range []struct {
		name string
		cfg  idem.Config
	}{
		{"MaxWaiters", idem.Config{MaxWaiters: 2}},
		{"MaxWaitersPerPrincipal", idem.Config{MaxWaitersPerPrincipal: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, rec := waitEngine(t, b.Store, tc.cfg)
			key := uniq("wait-cap")
			end := holder(t, b, eng, key)
			collect := waiters(t, b, context.Background(), eng, key, 2)
			start := time.Now()
			over := ServeContext(context.Background(), eng, "alice", key, func(context.Context) (int, []byte) {
				t.Error("the request over the cap ran the handler")
				return http.StatusCreated, nil
			})
			if took := time.Since(start); over.Status != http.StatusConflict || over.Header.Get("Retry-After") == "" || took > waitBound/2 {
				t.Fatalf("over the cap: %d %v after %v, want 409 with Retry-After at once", over.Status, over.Header, took)
			}
			first := end(http.StatusCreated)
			checkReplays(t, first, collect())
			if n := countWaits(rec); n[idem.WaitRefused] != 1 || n[idem.WaitReplayed] != 2 {
				t.Fatalf("wait outcomes %v, want 1 %s and 2 %s", n, idem.WaitRefused, idem.WaitReplayed)
			}
		})
	}
}

// testWaitOtherInstance: waiters on a second engine over the same store
// (another instance) are woken when the holder on the first settles: by
// polling, or, with polling off, by the store's notifications alone. With
// Backend.Peer the second engine has a store of its own on the same
// storage, as another process has, so that only the server carries the
// notification.
func testWaitOtherInstance(t *testing.T, b Backend, polling bool) {
	other := b.Store
	if b.Peer != nil {
		other = b.Peer(t).Store
	}
	one, _ := waitEngine(t, b.Store, idem.Config{})
	two, rec := waitEngine(t, other, idem.Config{})
	key := uniq("wait-instance")
	end := holder(t, b, one, key)
	ctx := context.Background()
	if !polling {
		ctx = hooks.WithoutPolling(ctx)
	}
	collect := waiters(t, b, ctx, two, key, 3)
	first := end(http.StatusCreated)
	checkReplays(t, first, collect())
	if n := countWaits(rec); n[idem.WaitReplayed] != 3 {
		t.Fatalf("wait outcomes on the other instance %v, want 3 %s", n, idem.WaitReplayed)
	}
}

// testWaitHoldsNoConn: waiters hold no pool connection. On a pool of
// three, with the holder's handler holding one, twenty waiters wait while
// other requests still claim, run and commit within StoreTimeout; a waiter
// holding a connection would empty the pool and they would get 503.
func testWaitHoldsNoConn(t *testing.T, b Backend) {
	if b.Pool == nil {
		t.Skip("not applicable: the store has no connection pool to empty (Backend.Pool)")
	}
	const poolSize, n = 3, 20
	store := b.Pool(t, poolSize)
	eng, _ := waitEngine(t, store, idem.Config{StoreTimeout: time.Second, RequestTimeout: 10 * time.Second})
	key := uniq("wait-pool")
	end := holder(t, b, eng, key)
	collect := waiters(t, b, context.Background(), eng, key, n)
	for i := range 3 {
		other := uniq("wait-pool-other")
		resp := ServeContext(context.Background(), eng, "bob", other, func(ctx context.Context) (int, []byte) {
			if err := b.WriteEffect(ctx, other); err != nil {
				t.Errorf("effect: %v", err)
			}
			return http.StatusCreated, []byte(`{}`)
		})
		if resp.Status != http.StatusCreated {
			t.Fatalf("request %d on another key while %d waiters wait on a pool of %d: %d %s, want 201",
				i, n, poolSize, resp.Status, resp.Body)
		}
	}
	first := end(http.StatusCreated)
	checkReplays(t, first, collect())
}
