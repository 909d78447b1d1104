package idemredis_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestRedisRestartMidRun kills a Redis of the test's own (never the shared
// :6379) with SIGKILL in the middle of a run and starts it again empty, as a
// Redis without persistence comes back. Four clients keep sending requests
// for settled and fresh keys throughout, each retrying until it gets a
// 201. The handler writes its payment keyed by idem.DownstreamKey in a
// unique column of the application's database (which the restart does not
// touch), and Reconcile answers a takeover from that row. Afterwards every
// key has exactly one payment, and every 201 a key ever answered carries
// that payment: the records the restart lost cost handler re-runs, which
// the unique column absorbed, and no double effect. The scripts the restart
// dropped from the server's cache come back through EVAL.
func TestRedisRestartMidRun(t *testing.T) {
	srv := startServer(t)
	cnt := &counter{}
	c := srv.client(t, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
		o.PoolSize = 8
	})
	c.AddHook(cnt)
	env := idemredistest.NewEnv(t, c)
	db := newPaymentsDB()
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey,
		Store: env.Store, RequestTimeout: 500 * time.Millisecond, StoreTimeout: 500 * time.Millisecond,
		Lease: 1500 * time.Millisecond, Reconcile: reconcileFrom(db),
	})
	mustNil(t, err)

	var (
		mu      sync.Mutex
		answers = map[string][][]byte{} // key → bodies of its 201s
		status  = map[int]int{}
		keys    []string
		slowest time.Duration
	)
	request := func(key string) {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			start := time.Now()
			resp := run(eng, "alice", key, paymentHandler(db, key))
			took := time.Since(start)
			mu.Lock()
			slowest = max(slowest, took)
			status[resp.Status]++
			if resp.Status == http.StatusCreated {
				answers[key] = append(answers[key], bytes.Clone(resp.Body))
				mu.Unlock()
				return
			}
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
		t.Errorf("key %s never answered 201", key)
	}
	// Settled keys before the restart.
	for i := range 100 {
		key := fmt.Sprintf("before-%d-%s", i, idemredistest.RandHex(3))
		keys = append(keys, key)
		request(key)
	}
	cnt.recording.Store(true)

	var (
		stop      atomic.Bool
		wg        sync.WaitGroup
		restarted = make(chan time.Duration, 1)
	)
	go func() {
		time.Sleep(400 * time.Millisecond)
		start := time.Now()
		srv.kill()
		time.Sleep(300 * time.Millisecond)
		srv.start()
		restarted <- time.Since(start)
	}()
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 42))
			for i := 0; !stop.Load(); i++ {
				var key string
				mu.Lock()
				if i%3 == 0 {
					key = fmt.Sprintf("during-%d-%d-%s", w, i, idemredistest.RandHex(3))
					keys = append(keys, key)
				} else {
					key = keys[r.IntN(len(keys))]
				}
				mu.Unlock()
				request(key)
				time.Sleep(5 * time.Millisecond) // bounded load: two cores are shared
			}
		})
	}
	time.Sleep(2 * time.Second)
	down := <-restarted
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	cnt.recording.Store(false)

	mu.Lock()
	defer mu.Unlock()
	lost := 0
	for _, key := range keys {
		if n := db.rowsFor(key); n != 1 {
			t.Fatalf("key %s has %d payments, want exactly 1", key, n)
		}
		bodies := answers[key]
		for _, b := range bodies[1:] {
			if !bytes.Equal(b, bodies[0]) {
				t.Fatalf("key %s answered %s and later %s: two different payments", key, bodies[0], b)
			}
		}
	}
	for _, cmd := range cnt.commands {
		if cmd == "eval" {
			lost++
		}
	}
	requests := 0
	for _, n := range status {
		requests += n
	}
	t.Logf("restart (SIGKILL, start empty) took %v; %d keys, %d requests: statuses %v, slowest request %v; "+
		"%d handler re-runs absorbed by the unique downstream-key column; %d EVAL fallbacks after NOSCRIPT; "+
		"every key: exactly 1 payment, every 201 the same payment",
		down.Round(time.Millisecond), len(keys), requests, status, slowest.Round(time.Millisecond), db.conflicts.Load(), lost)
	if db.conflicts.Load() == 0 {
		t.Fatal("the restart lost no settled record that a retry ran again: the test did not exercise it")
	}
}
