// Command retention measures whether idempgx's batched purge keeps up at
// volume. It fills a records table of its own (idem_bench.retention_keys,
// made by the store's Migrate) to a steady state of -rows settled records
// with generate_series, a share of them (-expired) already past their
// expiry (the backlog of a sweeper that fell behind) and the rest expiring
// evenly at -rate per second, as a service at that rate with that
// retention would leave them. Then it runs first requests (claim, BEGIN,
// settle with COMMIT) at a fixed -rate, in three phases:
//
//  1. no sweeper: claim latency without purging;
//  2. sweepers purging continuously (-sweepers of them, core's Sweeper
//     with -batch): purge rows per second while draining the backlog,
//     and claim latency while they run;
//  3. -cycles steady-state cycles: a sweep every -interval, then VACUUM
//     (autovacuum is off on the test server; in production it does this),
//     and the table's and indexes' size after each.
//
// It drops the table at the end (unless -keep), so the shared test
// database does not keep millions of rows. It is not part of make test:
//
//	cd bench && go run ./cmd/retention                 # 5 million rows, ~10 min
//	cd bench && go run ./cmd/retention -rows 200000 -phase 10s -cycles 2   # a quick look
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/bench"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

const table = bench.Schema + ".retention_keys"

func main() {
	var (
		rows     = flag.Int("rows", 5_000_000, "records in the table at the start")
		expired  = flag.Float64("expired", 0.1, "share of them already expired (the backlog)")
		rate     = flag.Int("rate", 200, "first requests per second, fixed")
		workers  = flag.Int("workers", 32, "goroutines serving the fixed rate (a request that finds none free is counted as missed)")
		phase    = flag.Duration("phase", 30*time.Second, "length of phases 1 and 2 (phase 2 ends early once the backlog is gone)")
		sweepers = flag.Int("sweepers", 1, "sweepers purging at once in phase 2")
		batch    = flag.Int("batch", 500, "Sweeper.BatchSize")
		cycles   = flag.Int("cycles", 3, "steady-state purge cycles in phase 3")
		interval = flag.Duration("interval", 10*time.Second, "length of one cycle in phase 3 (a sweep at its end)")
		keep     = flag.Bool("keep", false, "keep the table at the end")
	)
	flag.Parse()
	log.SetFlags(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cfg, err := pgxpool.ParseConfig(bench.DSN())
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = int32(*workers + *sweepers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	r := &run{pool: pool, rate: *rate, workers: *workers}
	if err := r.setup(ctx); err != nil {
		log.Fatal(err)
	}
	if !*keep {
		defer func() {
			if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table); err != nil {
				log.Printf("drop %s: %v", table, err)
			} else {
				log.Printf("dropped %s", table)
			}
		}()
	}
	if err := r.main(ctx, *rows, *expired, *phase, *sweepers, *batch, *cycles, *interval); err != nil {
		log.Print(err)
	}
}

type run struct {
	pool    *pgxpool.Pool
	store   *idempgx.Store
	rate    int
	workers int
	seq     atomic.Int64
	header  []byte
	body    []byte
}

func (r *run) setup(ctx context.Context) error {
	if _, err := r.pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+bench.Schema); err != nil {
		return err
	}
	if _, err := r.pool.Exec(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
		return err
	}
	s, err := idempgx.New(r.pool, idempgx.WithTable(table))
	if err != nil {
		return err
	}
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	r.store = s
	r.header = idemstore.EncodeHeader(http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/pay_0123456789abcdef"}})
	r.body = []byte(`{"id":"pay_0123456789abcdef","amount":1000,"currency":"EUR","description":"coffee","status":"succeeded"}`)
	return nil
}

func (r *run) main(ctx context.Context, rows int, expired float64, phase time.Duration, sweepers, batch, cycles int, interval time.Duration) error {
	backlog := int(float64(rows) * expired)
	// The rest expire evenly from now on, at the request rate: the
	// retention of a service at -rate that left -rows records.
	window := time.Duration(float64(rows-backlog) / float64(r.rate) * float64(time.Second))
	log.Printf("filling %s: %d records, %d of them expired, the rest expiring over %v (%d/s)",
		table, rows, backlog, window.Round(time.Second), r.rate)
	start := time.Now()
	const chunk = 250_000
	for lo := 1; lo <= rows; lo += chunk {
		hi := min(lo+chunk-1, rows)
		_, err := r.pool.Exec(ctx, `INSERT INTO `+table+` (principal, key, fingerprint, state, lease_token, nonce, request_id,
	created_at, locked_at, expires_at, status, headers, body)
SELECT 'acct_' || (i % 1000), 'fill-' || i, sha256(int8send(i)), 'completed', md5(i::text), md5('n' || i), 'req_' || i,
	e - $5::bigint * interval '1 microsecond', e - $5::bigint * interval '1 microsecond', e, 201, $6, $7
FROM generate_series($1::bigint, $2::bigint) AS i,
	LATERAL (SELECT CASE WHEN i <= $3 THEN now() - (($3 - i + 1) * interval '1 millisecond')
		ELSE now() + ((i - $3) * $4::bigint * interval '1 microsecond') END AS e) AS x`,
			lo, hi, backlog, int64(time.Second/time.Microsecond)/int64(r.rate), window.Microseconds(), r.header, r.body)
		if err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		if hi%1_000_000 == 0 || hi == rows {
			log.Printf("  %d rows, %v", hi, time.Since(start).Round(time.Second))
		}
	}
	fill := time.Since(start)
	start = time.Now()
	if _, err := r.pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
		return err
	}
	log.Printf("fill: %v; VACUUM ANALYZE: %v", fill.Round(time.Second), time.Since(start).Round(time.Second))
	r.sizes(ctx, "after the fill")

	// Phase 1: claims alone.
	log.Printf("phase 1: %d first requests/s for %v, no sweeper", r.rate, phase)
	lat := r.load(ctx, phase, nil)
	lat.report("phase 1 (no purge)")

	// Phase 2: claims while sweepers drain the backlog.
	log.Printf("phase 2: %d first requests/s, %d sweeper(s) purging continuously (batch %d), at most %v",
		r.rate, sweepers, batch, phase)
	var (
		purged    atomic.Int64
		sweeps    atomic.Int64
		drainedAt atomic.Int64
	)
	p2 := time.Now()
	lat = r.load(ctx, phase, func(ctx context.Context, done func()) {
		var wg sync.WaitGroup
		for range sweepers {
			wg.Go(func() {
				s := idem.Sweeper{Store: r.store, BatchSize: batch, MaxBatches: 1}
				for ctx.Err() == nil {
					res, err := s.Sweep(ctx)
					purged.Add(int64(res.Purged))
					sweeps.Add(1)
					if ctx.Err() != nil {
						return // the phase ended
					}
					if err != nil {
						log.Printf("sweep: %v", err)
						return
					}
					if res.Purged < batch {
						drainedAt.CompareAndSwap(0, int64(time.Since(p2)))
						done() // the backlog is gone: end the phase
						return
					}
				}
			})
		}
		wg.Wait()
	})
	busy := time.Duration(drainedAt.Load())
	if busy == 0 {
		busy = time.Since(p2)
	}
	lat.report("phase 2 (purging)")
	log.Printf("phase 2: purged %d rows in %v (%d batches): %.0f rows/s against %d inserts/s; backlog drained: %v",
		purged.Load(), busy.Round(time.Millisecond), sweeps.Load(), float64(purged.Load())/busy.Seconds(), r.rate, drainedAt.Load() != 0)
	r.sizes(ctx, "after phase 2, before VACUUM")
	start = time.Now()
	if _, err := r.pool.Exec(ctx, "VACUUM "+table); err != nil {
		return err
	}
	log.Printf("VACUUM: %v", time.Since(start).Round(time.Millisecond))
	r.sizes(ctx, "after phase 2 and VACUUM")

	// Phase 3: steady state, a sweep per cycle.
	for c := range cycles {
		lat = r.load(ctx, interval, nil)
		t0 := time.Now()
		res, err := (&idem.Sweeper{Store: r.store, BatchSize: batch, MaxBatches: 1000}).Sweep(ctx)
		if err != nil {
			return err
		}
		sweep := time.Since(t0)
		t0 = time.Now()
		if _, err := r.pool.Exec(ctx, "VACUUM "+table); err != nil {
			return err
		}
		lat.report(fmt.Sprintf("phase 3, cycle %d", c+1))
		log.Printf("phase 3, cycle %d: sweep purged %d rows in %v (%.0f rows/s), VACUUM %v",
			c+1, res.Purged, sweep.Round(time.Millisecond), float64(res.Purged)/sweep.Seconds(), time.Since(t0).Round(time.Millisecond))
		r.sizes(ctx, fmt.Sprintf("after cycle %d", c+1))
	}
	return nil
}

// load runs first requests at the fixed rate for d, with side (if not nil)
// running beside them; side may end the phase early by calling done.
func (r *run) load(ctx context.Context, d time.Duration, side func(ctx context.Context, done func())) latencies {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	jobs := make(chan time.Time, r.workers)
	var (
		mu     sync.Mutex
		lat    latencies
		wg     sync.WaitGroup
		missed atomic.Int64
	)
	for range r.workers {
		wg.Go(func() {
			var claim, total []time.Duration
			var errs int
			for due := range jobs {
				c, err := r.first(ctx, due)
				if err != nil {
					if ctx.Err() == nil {
						errs++
						if errs == 1 {
							log.Printf("request: %v", err)
						}
					}
					continue
				}
				claim, total = append(claim, c), append(total, time.Since(due))
			}
			mu.Lock()
			lat.claim, lat.total, lat.errors = append(lat.claim, claim...), append(lat.total, total...), lat.errors+errs
			mu.Unlock()
		})
	}
	if side != nil {
		wg.Go(func() { side(ctx, cancel) })
	}
	start := time.Now()
	period := time.Second / time.Duration(r.rate)
	for i := 0; ; i++ {
		due := start.Add(time.Duration(i) * period)
		if w := time.Until(due); w > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(w):
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case jobs <- due:
		default:
			missed.Add(1)
		}
	}
	close(jobs)
	wg.Wait()
	lat.missed = missed.Load()
	lat.elapsed = time.Since(start)
	return lat
}

// first runs one first request's store work: claim a new key, begin, settle
// with a stored 201 (COMMIT pipelined). It returns the claim's latency.
func (r *run) first(ctx context.Context, due time.Time) (time.Duration, error) {
	n := r.seq.Add(1)
	req := idemstore.ClaimRequest{
		Principal: fmt.Sprintf("acct_%d", n%1000), Key: fmt.Sprintf("live-%d-%d", due.UnixNano(), n),
		Fingerprint: make([]byte, 32), Token: fmt.Sprintf("%032x", n), Nonce: fmt.Sprintf("n%031x", n), RequestID: fmt.Sprintf("req_live_%d", n),
		Lease: time.Minute, Retention: 24 * time.Hour,
	}
	t0 := time.Now()
	res, err := r.store.Claim(ctx, req)
	claim := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if !res.Claimed {
		return 0, errors.New("claim of a new key did not claim")
	}
	_, tx, err := r.store.BeginTx(ctx, idemstore.Lease{Principal: req.Principal, Key: req.Key, Token: req.Token})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	hdr := http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/pay_0123456789abcdef"}}
	if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201, Header: hdr, Body: r.body}}); err != nil {
		return 0, err
	}
	return claim, nil
}

type latencies struct {
	claim, total []time.Duration
	errors       int
	missed       int64
	elapsed      time.Duration
}

func (l latencies) report(name string) {
	q := func(v []time.Duration, p float64) time.Duration {
		if len(v) == 0 {
			return 0
		}
		return v[min(len(v)-1, int(float64(len(v))*p))]
	}
	slices.Sort(l.claim)
	slices.Sort(l.total)
	log.Printf("%s: %d requests in %v (%.0f/s), %d errors, %d missed; claim p50 %v p99 %v max %v; whole request (from its due time) p50 %v p99 %v",
		name, len(l.total), l.elapsed.Round(time.Millisecond), float64(len(l.total))/l.elapsed.Seconds(), l.errors, l.missed,
		q(l.claim, 0.5).Round(time.Microsecond), q(l.claim, 0.99).Round(time.Microsecond), q(l.claim, 1).Round(time.Microsecond),
		q(l.total, 0.5).Round(time.Microsecond), q(l.total, 0.99).Round(time.Microsecond))
}

// sizes logs the table's and each index's size and the live and dead
// tuple counts.
func (r *run) sizes(ctx context.Context, when string) {
	var heap, idx, live, dead int64
	err := r.pool.QueryRow(ctx, `SELECT pg_relation_size($1::regclass), pg_indexes_size($1::regclass),
	coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0),
	coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)`, table).Scan(&heap, &idx, &live, &dead)
	if err != nil {
		log.Printf("sizes: %v", err)
		return
	}
	rows, err := r.pool.Query(ctx, `SELECT c.relname, pg_relation_size(i.indexrelid) FROM pg_index i
	JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass ORDER BY c.relname`, table)
	if err != nil {
		log.Printf("sizes: %v", err)
		return
	}
	var per string
	for rows.Next() {
		var name string
		var size int64
		if err := rows.Scan(&name, &size); err != nil {
			log.Printf("sizes: %v", err)
			return
		}
		per += fmt.Sprintf(" %s %s;", name, mib(size))
	}
	log.Printf("size %s: heap %s, indexes %s (%s), ~%d live and ~%d dead tuples", when, mib(heap), mib(idx), per, live, dead)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
