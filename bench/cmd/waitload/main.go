// Command waitload measures Config.WaitInFlight under load: n concurrent
// duplicates of one request whose handler holds its key for -hold, on
// idempgx, across -instances engines sharing one table (the holder on the
// first). It reports how many got the replay and how long after the
// holder's settle, and the connections in use meanwhile: the pools'
// acquired connections and the server's backends of this program
// (pg_stat_activity), sampled every 5 ms.
//
//	go run ./bench/cmd/waitload -n 500 -hold 1s -instances 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/bench"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

const (
	appName = "idem_waitload"
	// arrival is how long after the duplicates are sent their first claims
	// are counted as arriving, not waiting.
	arrival = 250 * time.Millisecond
)

func main() {
	n := flag.Int("n", 500, "concurrent duplicates")
	hold := flag.Duration("hold", time.Second, "how long the first request's handler holds the key")
	wait := flag.Duration("wait", 5*time.Second, "Config.WaitInFlight")
	instances := flag.Int("instances", 1, "engines (instances) sharing the table, each with its own pool; the duplicates are spread over them")
	poolSize := flag.Int("pool", 10, "connections per instance's pool")
	flag.Parse()
	if err := run(*n, *hold, *wait, *instances, int32(*poolSize)); err != nil {
		log.Fatal(err)
	}
}

func run(n int, hold, wait time.Duration, instances int, poolSize int32) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	table := fmt.Sprintf("%s.wait_keys_%d", bench.Schema, time.Now().UnixNano())
	var pools []*pgxpool.Pool
	var engines []*idem.Engine
	key := make([]byte, 32)
	for i := range instances {
		cfg, err := pgxpool.ParseConfig(bench.DSN())
		if err != nil {
			return err
		}
		cfg.MaxConns, cfg.MinConns = poolSize, 0
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		if i == 0 {
			if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+bench.Schema); err != nil {
				return err
			}
		}
		store, err := idempgx.New(pool, idempgx.WithTable(table))
		if err != nil {
			return err
		}
		if i == 0 {
			if err := store.Migrate(ctx); err != nil {
				return err
			}
			defer pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) //nolint:errcheck
		}
		eng, err := idem.New(idem.Config{Store: store, FingerprintKey: key, WaitInFlight: wait,
			MaxWaiters: n + 1, MaxWaitersPerPrincipal: n + 1, AllowTxUnused: true})
		if err != nil {
			return err
		}
		defer eng.Close()
		pools, engines = append(pools, pool), append(engines, eng)
	}
	_, notifies := engines[0].Config().Store.(idemstore.Notifier)

	monitor, err := pgx.Connect(ctx, bench.DSN())
	if err != nil {
		return err
	}
	defer monitor.Close(context.Background())

	call := idem.Call{Principal: "p", Key: "k", Operation: "Pay", Encoding: "application/json", Input: []byte(`{"amount":1}`)}
	inside, settled, holderDone := make(chan struct{}), make(chan time.Time, 1), make(chan struct{})
	var runs atomic.Int32
	go func() {
		_, err := engines[0].Do(ctx, call, func(context.Context) (idem.Response, error) {
			runs.Add(1)
			close(inside)
			time.Sleep(hold)
			return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
		})
		settled <- time.Now()
		close(holderDone)
		if err != nil {
			log.Printf("holder: %v", err)
		}
	}()
	<-inside

	// Sample what is in use: during the duplicates' arrival (their first
	// claims, the first -arrival after they are sent) and while they wait
	// (from then to the settle).
	var maxAcquired, maxBackends, maxBusy [2]atomic.Int64
	var arrived atomic.Bool
	stop := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-holderDone:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var acq int64
			for _, p := range pools {
				acq += int64(p.Stat().AcquiredConns())
			}
			phase := 0
			if arrived.Load() {
				phase = 1
			}
			storeMax(&maxAcquired[phase], acq)
			var total, busy int64
			if err := monitor.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state <> 'idle')
				FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&total, &busy); err == nil {
				storeMax(&maxBackends[phase], total)
				storeMax(&maxBusy[phase], busy)
			}
		}
	})

	type result struct {
		at       time.Time
		replayed bool
		err      error
	}
	results := make([]result, n)
	start := time.Now()
	time.AfterFunc(arrival, func() { arrived.Store(true) })
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := engines[i%instances].Do(ctx, call, func(context.Context) (idem.Response, error) {
				runs.Add(1)
				return idem.Response{Status: 201}, nil
			})
			results[i] = result{at: time.Now(), replayed: res.Replayed && res.Status == 201, err: err}
		})
	}
	wg.Wait()
	close(stop)
	sampling.Wait()
	at := <-settled

	var after []time.Duration
	replayed := 0
	var errs []error
	for _, r := range results {
		if r.replayed {
			replayed++
			after = append(after, r.at.Sub(at))
		} else if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	slices.Sort(after)
	q := func(p float64) time.Duration {
		if len(after) == 0 {
			return 0
		}
		return after[min(len(after)-1, int(p*float64(len(after))))]
	}
	fmt.Printf("duplicates %d over %d instance(s) (pool %d each, Notifier %v), holder %v, WaitInFlight %v, sent %v before the settle\n",
		n, instances, pools[0].Config().MaxConns, notifies, hold, wait, at.Sub(start).Round(time.Millisecond))
	fmt.Printf("replayed 201: %d of %d; handler runs: %d; errors: %d %v\n", replayed, n, runs.Load(), len(errs), errors.Join(firstErrs(errs, 3)...))
	fmt.Printf("answered after the settle: p50 %v  p99 %v  max %v\n", q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), q(1).Round(time.Millisecond))
	for phase, what := range []string{fmt.Sprintf("arriving (first %v)", arrival), "waiting (then to the settle)"} {
		fmt.Printf("%s: pool acquired conns max %d (of %d); pg_stat_activity backends of this program max %d, not idle max %d\n",
			what, maxAcquired[phase].Load(), int64(instances)*int64(poolSize), maxBackends[phase].Load(), maxBusy[phase].Load())
	}
	if replayed != n {
		os.Exit(1)
	}
	return nil
}

func storeMax(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}

func firstErrs(errs []error, k int) []error { return errs[:min(k, len(errs))] }
