// Command waitload measures Config.WaitInFlight under load: n concurrent
// duplicates of one request whose handler holds its key for -hold, on
// -store, across -instances engines sharing one table or key prefix (the
// holder on the first), each instance with its own pool. It reports how
// many got the replay and how long after the holder's handler returned
// (its settle included), and the connections in use meanwhile, sampled
// every 5 ms: the pools' connections in use and, on PostgreSQL, this
// program's backends in pg_stat_activity, on Redis its connections in
// CLIENT LIST.
//
// -notify picks the wake-up across instances: idempgx's
// WithNotifications, idemredis's pub/sub (on unless -notify=false, which
// hides the store's Subscribe so that only polling answers the waiters on
// the other instances). idemsql and memstore have no notifications.
//
//	go run ./bench/cmd/waitload -store redis -n 500 -hold 1s -instances 3
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/bench"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
	idemredis "github.com/idemgo/idem/stores/redis"
	idemsql "github.com/idemgo/idem/stores/sql"
)

const appName = "idem_waitload"

// stores are the values of -store.
var stores = []string{"pgx", "redis", "sql-postgres", "sql-mysql", "memory"}

func main() {
	store := flag.String("store", "pgx", "store: "+strings.Join(stores, ", "))
	notify := flag.Bool("notify", false, "wake waiters on other instances by the store's notifications (pgx: WithNotifications; redis: on unless -notify=false)")
	n := flag.Int("n", 500, "concurrent duplicates")
	hold := flag.Duration("hold", time.Second, "how long the first request's handler holds the key")
	wait := flag.Duration("wait", 5*time.Second, "Config.WaitInFlight")
	instances := flag.Int("instances", 1, "engines (instances) sharing the table, each with its own pool; the duplicates are spread over them")
	poolSize := flag.Int("pool", 10, "connections per instance's pool")
	arrival := flag.Duration("arrival", 500*time.Millisecond, "how long after the duplicates are sent their first claims count as arriving, not waiting (less than -hold)")
	flag.Parse()
	if *arrival >= *hold {
		log.Fatalf("-arrival %v must be less than -hold %v", *arrival, *hold)
	}
	notifySet := false
	flag.Visit(func(f *flag.Flag) { notifySet = notifySet || f.Name == "notify" })
	if *store == "redis" && !notifySet {
		*notify = true
	}
	if err := run(*store, *notify, *n, *hold, *wait, *arrival, *instances, *poolSize); err != nil {
		log.Fatal(err)
	}
}

// backend is -store opened for every instance.
type backend struct {
	stores []idemstore.Store
	// inUse returns the connections the instances' pools have in use
	// (-1: the store has no pool).
	inUse func() int64
	// server returns this program's connections the server sees, and how
	// many of them are not idle (-1: not known; server nil: not measured).
	server func(ctx context.Context) (total, busy int64, err error)
	what   string // what server counts
	closes []func()
}

func (b *backend) close() {
	for _, f := range slices.Backward(b.closes) {
		f()
	}
}

// onClose has close call f, in the reverse order of the calls.
func (b *backend) onClose(f func()) { b.closes = append(b.closes, f) }

// quiet is a store whose notifications are broken: its Subscribe reports
// them off, so the engine's waiters on other instances poll.
type quiet struct{ *idemredis.Store }

func (quiet) Subscribe(func(string)) (func(), error) { return nil, idemstore.ErrNotificationsOff }

func open(ctx context.Context, store string, notify bool, instances, poolSize int) (*backend, error) {
	b := &backend{inUse: func() int64 { return -1 }}
	ok := false
	defer func() {
		if !ok {
			b.close()
		}
	}()
	suffix := fmt.Sprint(time.Now().UnixNano())
	switch store {
	case "pgx", "sql-postgres":
		admin, err := bench.OpenPool(ctx, 1, nil)
		if err != nil {
			return nil, err
		}
		b.onClose(admin.Close)
		// Every connection opened from here on, the pools' and a
		// listener's, carries appName, which pg_stat_activity shows.
		if err := os.Setenv("PGAPPNAME", appName); err != nil {
			return nil, err
		}
		if _, err := admin.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+bench.Schema); err != nil {
			return nil, err
		}
		table := bench.Schema + ".wait_keys_" + suffix
		b.onClose(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
		monitor, err := pgx.Connect(ctx, bench.DSN())
		if err != nil {
			return nil, err
		}
		b.onClose(func() { _ = monitor.Close(context.Background()) })
		b.what = "pg_stat_activity backends"
		b.server = func(ctx context.Context) (total, busy int64, err error) {
			err = monitor.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state <> 'idle')
				FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, appName).Scan(&total, &busy)
			return total, busy, err
		}
		if store == "pgx" {
			var acquired []func() int32
			for i := range instances {
				pool, err := bench.OpenPool(ctx, int32(poolSize), nil)
				if err != nil {
					return nil, err
				}
				b.onClose(pool.Close)
				opts := []idempgx.Option{idempgx.WithTable(table)}
				if notify {
					opts = append(opts, idempgx.WithNotifications())
				}
				s, err := idempgx.New(pool, opts...)
				if err != nil {
					return nil, err
				}
				if i == 0 {
					if err := s.Migrate(ctx); err != nil {
						return nil, err
					}
				}
				b.stores = append(b.stores, s)
				acquired = append(acquired, func() int32 { return pool.Stat().AcquiredConns() })
			}
			b.inUse = func() (n int64) {
				for _, f := range acquired {
					n += int64(f())
				}
				return n
			}
		} else {
			if err := openSQL(ctx, b, instances, poolSize, table, func(ctx context.Context) (*sql.DB, error) {
				return bench.OpenPostgresSQL(ctx, poolSize)
			}); err != nil {
				return nil, err
			}
		}
	case "sql-mysql":
		table := "idem_wait_keys_" + suffix
		admin, err := bench.OpenMySQL(ctx, 1, nil)
		if err != nil {
			return nil, err
		}
		b.onClose(func() { _ = admin.Close() })
		b.onClose(func() { _, _ = admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })
		if err := openSQL(ctx, b, instances, poolSize, table, func(ctx context.Context) (*sql.DB, error) {
			return bench.OpenMySQL(ctx, poolSize, nil)
		}); err != nil {
			return nil, err
		}
	case "redis":
		prefix := "idem_wait_" + suffix + ":"
		var clients []*redis.Client
		for range instances {
			rdb, err := bench.OpenRedisNamed(ctx, appName, poolSize, nil)
			if err != nil {
				return nil, err
			}
			b.onClose(func() { _ = rdb.Close() })
			s, err := idemredis.New(rdb, idemredis.WithPrefix(prefix))
			if err != nil {
				return nil, err
			}
			if notify {
				b.stores = append(b.stores, s)
			} else {
				b.stores = append(b.stores, quiet{s})
			}
			clients = append(clients, rdb)
		}
		b.onClose(func() { deletePrefix(clients[0], prefix) })
		b.inUse = func() (n int64) {
			for _, c := range clients {
				st := c.PoolStats()
				n += int64(st.TotalConns) - int64(st.IdleConns)
			}
			return n
		}
		monitor := redis.NewClient(&redis.Options{Addr: clients[0].Options().Addr, PoolSize: 1})
		b.onClose(func() { _ = monitor.Close() })
		b.what = "CLIENT LIST connections"
		b.server = func(ctx context.Context) (total, busy int64, err error) {
			// Redis runs one command at a time: every connection but the
			// one asking is idle while CLIENT LIST runs, so only the count
			// of connections says anything.
			list, err := monitor.ClientList(ctx).Result()
			for line := range strings.Lines(list) {
				if strings.Contains(line, " name="+appName+" ") {
					total++
				}
			}
			return total, -1, err
		}
	case "memory":
		s, err := memstore.New()
		if err != nil {
			return nil, err
		}
		for range instances {
			b.stores = append(b.stores, s)
		}
	default:
		return nil, fmt.Errorf("unknown -store %q (want one of %s)", store, strings.Join(stores, ", "))
	}
	ok = true
	return b, nil
}

// openSQL opens idemsql on table for every instance, each on its own pool.
func openSQL(ctx context.Context, b *backend, instances, poolSize int, table string, openDB func(context.Context) (*sql.DB, error)) error {
	var dbs []*sql.DB
	for i := range instances {
		db, err := openDB(ctx)
		if err != nil {
			return err
		}
		b.onClose(func() { _ = db.Close() })
		s, err := idemsql.New(db, idemsql.WithTable(table))
		if err != nil {
			return err
		}
		if i == 0 {
			if err := s.Migrate(ctx); err != nil {
				return err
			}
		}
		b.stores = append(b.stores, s)
		dbs = append(dbs, db)
	}
	b.inUse = func() (n int64) {
		for _, db := range dbs {
			n += int64(db.Stats().InUse)
		}
		return n
	}
	return nil
}

func deletePrefix(rdb *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

func run(store string, notify bool, n int, hold, wait, arrival time.Duration, instances, poolSize int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := open(ctx, store, notify, instances, poolSize)
	if err != nil {
		return fmt.Errorf("%s: %w", store, err)
	}
	defer b.close()
	key := make([]byte, 32)
	var engines []*idem.Engine
	for _, s := range b.stores {
		eng, err := idem.New(idem.Config{Store: s, FingerprintKey: key, WaitInFlight: wait,
			MaxWaiters: n + 1, MaxWaitersPerPrincipal: n + 1, AllowTxUnused: true})
		if err != nil {
			return err
		}
		defer eng.Close()
		engines = append(engines, eng)
	}
	notifies := false
	if nf, ok := b.stores[0].(idemstore.Notifier); ok {
		// The engines subscribed already; a second subscription only
		// tells whether the store delivers.
		if stop, err := nf.Subscribe(func(string) {}); err == nil {
			stop()
			notifies = true
		}
	}

	call := idem.Call{Principal: "p", Key: "k", Operation: "Pay", Encoding: "application/json", Input: []byte(`{"amount":1}`)}
	// returned is when the holder's handler returns: its settle starts, and
	// the duplicates' wait ends.
	inside, returned, handlerDone := make(chan struct{}), make(chan time.Time, 1), make(chan struct{})
	var runs atomic.Int32
	go func() {
		_, err := engines[0].Do(ctx, call, func(context.Context) (idem.Response, error) {
			runs.Add(1)
			close(inside)
			time.Sleep(hold)
			returned <- time.Now()
			close(handlerDone)
			return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
		})
		if err != nil {
			log.Printf("holder: %v", err)
		}
	}()
	<-inside

	// Sample what is in use: during the duplicates' arrival (their first
	// claims, the first -arrival after they are sent) and while they wait
	// (from then until the holder's handler returns).
	var maxInUse, maxConns, maxBusy [2]atomic.Int64
	maxBusy[0].Store(-1)
	maxBusy[1].Store(-1)
	var samples [2]atomic.Int64
	var arrived atomic.Bool
	stop := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-handlerDone:
				return
			case <-time.After(5 * time.Millisecond):
			}
			phase := 0
			if arrived.Load() {
				phase = 1
			}
			samples[phase].Add(1)
			storeMax(&maxInUse[phase], b.inUse())
			if b.server == nil {
				continue
			}
			if total, busy, err := b.server(ctx); err == nil {
				storeMax(&maxConns[phase], total)
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
	at := <-returned

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
	fmt.Printf("store %s: duplicates %d over %d instance(s) (pool %d each, notifications %v), holder %v, WaitInFlight %v, sent %v before the handler returned\n",
		store, n, instances, poolSize, notifies, hold, wait, at.Sub(start).Round(time.Millisecond))
	fmt.Printf("replayed 201: %d of %d; handler runs: %d; errors: %d %v\n", replayed, n, runs.Load(), len(errs), errors.Join(firstErrs(errs, 3)...))
	fmt.Printf("answered after the handler returned (the settle included): p50 %v  p99 %v  max %v\n", q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), q(1).Round(time.Millisecond))
	for phase, what := range []string{fmt.Sprintf("arriving (first %v)", arrival), "waiting (then until the handler returned)"} {
		line := fmt.Sprintf("%s: pool conns in use max %d (of %d)", what, maxInUse[phase].Load(), instances*poolSize)
		switch {
		case samples[phase].Load() == 0:
			fmt.Println(what + ": not sampled (no duplicate was still waiting)")
			continue
		case b.inUse() < 0:
			line = what + ": no pool"
		}
		if b.server != nil {
			line += fmt.Sprintf("; %s of this program max %d", b.what, maxConns[phase].Load())
			if busy := maxBusy[phase].Load(); busy >= 0 {
				line += fmt.Sprintf(", not idle max %d", busy)
			}
		}
		fmt.Println(line)
	}
	if replayed != n {
		return fmt.Errorf("%d of %d duplicates did not get the replay", n-replayed, n)
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
