package storetest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// principalStore is a Store whose ListStale sees one principal's records
// only, so a sweeper in the suite never touches what other tests (or other
// test processes sharing the server) left stale.
type principalStore struct {
	idemstore.Store
	principal string
}

func (s principalStore) ListStale(ctx context.Context, limit int) ([]idem.Record, error) {
	all, err := s.Store.ListStale(ctx, limit+1000)
	var mine []idem.Record
	for _, r := range all {
		if r.Principal == s.principal && len(mine) < limit {
			mine = append(mine, r)
		}
	}
	return mine, err
}

// provider is a payment provider that charges once per request, as real
// ones do by the downstream key (idem.DownstreamKey, here the request's
// key), and counts the handler runs that called it.
type provider struct {
	mu      sync.Mutex
	charged map[string]bool
	runs    map[string]int
}

func (p *provider) charge(key string, run bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.charged[key] = true
	if run {
		p.runs[key]++
	}
}

func (p *provider) state(key string) (charged bool, runs int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charged[key], p.runs[key]
}

// testSweeperRacesRetry: crashed attempts left stale claims, half of them
// after charging the provider. A reconciling sweeper and a client retrying
// every key race for them. Whoever takes a claim over asks Reconcile (the
// sweeper stores its answer or releases the key; the client's takeover
// stores it or runs the handler), and the fenced takeover lets only one of
// them hold each key at a time. Each request must end with one stored
// outcome, and its client with the reconciled answer when the crashed
// attempt had charged (the handler never ran again), its own run
// otherwise: never both. The short RequestTimeout makes some takeovers run
// out of time on a busy store: a reconciled answer that cannot be stored
// must keep the claim, never release it for a blind run.
func testSweeperRacesRetry(t *testing.T, b Backend) {
	ctx := ctxT(t)
	const (
		rounds = 3
		keys   = 8
	)
	principal := uniq("sweeprace")
	store := principalStore{Store: b.Store, principal: principal}
	prov := &provider{charged: map[string]bool{}, runs: map[string]int{}}
	eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey,
		Store: store, RequestTimeout: 150 * time.Millisecond, StoreTimeout: 700 * time.Millisecond, Lease: time.Second,
		Reconcile: func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
			if charged, _ := prov.state(stale.Key); !charged {
				return nil, nil
			}
			return &idem.Response{Status: http.StatusCreated, Body: []byte("reconciled " + stale.Key)}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	request := func(key string) idem.Request {
		return idem.Request{Method: http.MethodPost, Path: "/payments", Principal: principal, Key: key,
			ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`), ContentLength: -1}
	}
	// The fingerprint the engine gives this principal's request, which a
	// crashed attempt's claim must carry to be taken over.
	probe, resp := eng.Begin(ctx, request("probe"))
	if probe == nil {
		t.Fatalf("probe did not claim: %+v", resp)
	}
	rec := get(t, b, principal, "probe")
	probe.Abort()

	var total idem.SweepResult
	for round := range rounds {
		var crashedKeys []string
		for i := range keys {
			key := fmt.Sprintf("r%d-k%d", round, i)
			req := idemstore.ClaimRequest{Principal: principal, Key: key, Fingerprint: rec.Fingerprint, Token: token(), Nonce: token(),
				Lease: time.Second, Retention: time.Hour}
			mustClaim(t, b.Store, req)
			if i%2 == 0 {
				prov.charge(key, false) // the crashed attempt charged, then died before its commit
			}
			crashedKeys = append(crashedKeys, key)
		}
		time.Sleep(time.Second + 150*time.Millisecond)

		start := make(chan struct{})
		var wg sync.WaitGroup
		var sweep idem.SweepResult
		var sweepErr error
		wg.Go(func() {
			<-start
			sweep, sweepErr = (&idem.Sweeper{Engine: eng}).Sweep(ctx)
		})
		answers := make([]string, keys)
		for i, key := range crashedKeys {
			wg.Go(func() {
				<-start
				// Staggered, so the sweeper, which resolves the keys
				// one after the other, wins some and the clients others.
				time.Sleep(time.Duration(i) * 15 * time.Millisecond)
				answers[i] = retryUntilAnswered(t, ctx, eng, b, prov, key, func() idem.Request { return request(key) })
			})
		}
		close(start)
		wg.Wait()
		if sweepErr != nil || sweep.Failed != 0 {
			t.Fatalf("round %d: sweep %+v: %v", round, sweep, sweepErr)
		}
		total.Reconciled += sweep.Reconciled
		total.Released += sweep.Released
		total.Raced += sweep.Raced
		for i, key := range crashedKeys {
			if t.Failed() {
				return
			}
			charged := i%2 == 0
			want := "ran " + key
			if charged {
				want = "reconciled " + key
			}
			if answers[i] != want {
				t.Fatalf("round %d %s (crash charged: %v): client got %q, want %q", round, key, charged, answers[i], want)
			}
			if paid, runs := prov.state(key); !paid || (charged && runs != 0) || (!charged && runs == 0) {
				t.Fatalf("round %d %s (crash charged: %v): charged %v, handler runs %d", round, key, charged, paid, runs)
			}
			// A run the deadline cut short is rolled back with its
			// write, so one effect is committed in all; a store without
			// a shared transaction keeps each run's write.
			wantEffects := 1
			if charged {
				wantEffects = 0
			}
			if n, err := b.CountEffects(ctx, principal+"|"+key); err != nil || n < wantEffects || (n > wantEffects && !b.NoSharedTx) {
				t.Fatalf("round %d %s: %d committed handler writes (%v), want %d", round, key, n, err, wantEffects)
			}
			if r := get(t, b, principal, key); r.State != idemstore.StateCompleted || r.Response == nil || string(r.Response.Body) != want {
				t.Fatalf("round %d %s: record %s %+v, want completed with %q", round, key, r.State, r.Response, want)
			}
		}
	}
	t.Logf("%d stale claims in %d rounds: the sweeper reconciled %d, released %d, lost %d races to retrying clients",
		rounds*keys, rounds, total.Reconciled, total.Released, total.Raced)
}

// retryUntilAnswered plays a client that retries key until it gets a 201,
// bounded in count and time, and returns the body. A run charges the
// provider and writes one effect in the store's transaction.
func retryUntilAnswered(t *testing.T, ctx context.Context, eng *idem.Engine, b Backend, prov *provider, key string,
	request func() idem.Request) string {
	deadline := time.Now().Add(30 * time.Second)
	var seen []string
	defer func() {
		if t.Failed() {
			t.Logf("%s: client saw %v", key, seen)
		}
	}()
	for try := 0; try < 500 && time.Now().Before(deadline); try++ {
		att, resp := eng.Begin(ctx, request())
		ran := att != nil
		if att != nil {
			prov.charge(key, true)
			var res idem.Result
			if err := b.WriteEffect(att.Context(), att.Lease().Principal+"|"+key); err != nil && !b.NoSharedTx {
				res = idem.Result{Status: http.StatusInternalServerError, Err: err}
			} else {
				res = idem.Result{Status: http.StatusCreated, Body: []byte("ran " + key)}
			}
			resp = att.Finish(res)
		}
		seen = append(seen, fmt.Sprintf("%d(ran %v) %s", resp.Status, ran, resp.Body))
		switch {
		case resp.Status == http.StatusCreated:
			return string(resp.Body)
		case resp.Status == http.StatusConflict, resp.Status == http.StatusServiceUnavailable:
			time.Sleep(20 * time.Millisecond) // the holder is settling; not its Retry-After, to keep the test short
		default:
			t.Errorf("%s: answered %d %s", key, resp.Status, resp.Body)
			return ""
		}
	}
	t.Errorf("%s: no answer after 500 tries or 30s", key)
	return ""
}
