package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// notifyPeer is a storetest.Peer on e's table: a store of its own on a
// pool of its own, whose sessions carry an application_name no other
// client has, so that its listening connection can be found and
// terminated.
func notifyPeer(t testing.TB, e *env) storetest.Peer {
	app := "idempgx-peer-" + randHex(4)
	cfg := idempgxtest.PoolConfig(t, 4)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool := idempgxtest.OpenPool(t, cfg)
	s := e.storeOn(t, pool, e.Schema+".idempotency_keys", idempgx.WithNotifications())
	return storetest.Peer{
		Store: s,
		KillListener: func() error {
			var n int
			err := e.Pool.QueryRow(testCtx(t), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app).Scan(&n)
			if err == nil && n != 1 {
				err = fmt.Errorf("found %d listening connections of %s, want 1", n, app)
			}
			return err
		},
		Acquired: func() int { return int(pool.Stat().AcquiredConns()) },
		Listening: func() int {
			var n int
			if err := e.Pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

// eavesdrop LISTENs on e's channel on a connection of the test's own and
// returns the payloads heard so far.
func eavesdrop(t testing.TB, e *env) func() []string {
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, dsn())
	if err == nil {
		_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{e.Store.Channel()}.Sanitize())
	}
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		heard []string
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			heard = append(heard, n.Payload)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), heard...)
	}
}

// TestNotifyStatements counts what each store call sends, statement by
// statement: without a subscription a first request and a replay cost
// what they cost a store that cannot notify; with one, settle and release
// each carry one statement more (the pg_notify) in the batch they send
// anyway, and nothing else changes.
func TestNotifyStatements(t *testing.T) {
	t.Parallel()
	c := &idempgxtest.Counter{}
	e := newEnv(t, newPool(t, 1, c), idempgx.WithNotifications())
	ctx := testCtx(t)
	cost := func(fn func() error) int64 {
		t.Helper()
		before := c.Statements.Load()
		if err := fn(); err != nil {
			t.Fatal(err)
		}
		return c.Statements.Load() - before
	}
	type costs struct{ claim, begin, settle, replay, release int64 }
	measure := func() costs {
		var got costs
		for range 2 { // the first pass warms the statement cache
			req := claimReq("alice", "st-"+randHex(4), "body", time.Minute)
			got.claim = cost(func() error { _, err := e.Store.Claim(ctx, req); return err })
			var tx idemstore.Tx
			got.begin = cost(func() (err error) { _, tx, err = e.Store.BeginTx(ctx, leaseOf(req)); return err })
			got.settle = cost(func() error { return tx.Settle(ctx, okResponse("{}")) })
			got.replay = cost(func() error {
				_, err := e.Store.Claim(ctx, claimReq("alice", req.Key, "body", time.Minute))
				return err
			})
			rel := claimReq("alice", "st-"+randHex(4), "body", time.Minute)
			if _, err := e.Store.Claim(ctx, rel); err != nil {
				t.Fatal(err)
			}
			got.release = cost(func() error { return e.Store.Release(ctx, leaseOf(rel)) })
		}
		return got
	}
	quiet := measure()
	stop, err := e.Store.Subscribe(func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	loud := measure()
	stop()
	after := measure()
	want := quiet
	want.settle++
	want.release++
	if loud != want {
		t.Errorf("subscribed: statements %+v, want %+v (unsubscribed %+v plus one pg_notify in settle and release)", loud, want, quiet)
	}
	if after != quiet {
		t.Errorf("after the last stop: statements %+v, want %+v as before any subscription", after, quiet)
	}
	t.Logf("statements per call: unsubscribed %+v, subscribed %+v", quiet, loud)
}

// BenchmarkSettleNotify measures a first request's store calls (claim,
// begin, settle) from one goroutine and from eight, on a store with no
// subscription and on one with a subscription, whose settles NOTIFY:
// PostgreSQL serialises notifying commits on one lock, held until the
// commit is flushed, which is the cost measured.
func BenchmarkSettleNotify(b *testing.B) {
	for _, par := range []int{1, 8} {
		for _, subscribed := range []bool{false, true} {
			name := fmt.Sprintf("par=%d/mode=quiet", par)
			if subscribed {
				name = fmt.Sprintf("par=%d/mode=notify", par)
			}
			b.Run(name, func(b *testing.B) { benchSettle(b, par, subscribed) })
		}
	}
}

func benchSettle(b *testing.B, par int, subscribed bool) {
	e := newEnv(b, newPool(b, 8, nil), idempgx.WithNotifications())
	if subscribed {
		stop, err := e.Store.Subscribe(func(string) {})
		if err != nil {
			b.Fatal(err)
		}
		defer stop()
	}
	ctx := testCtx(b)
	var next atomic.Int64
	n := int64(b.N)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= n {
				req := claimReq("alice", "b-"+randHex(8), "body", time.Minute)
				if _, err := e.Store.Claim(ctx, req); err != nil {
					b.Error(err)
					return
				}
				_, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
				if err == nil {
					err = tx.Settle(ctx, okResponse("{}"))
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestNotificationsOff: a store built without WithNotifications subscribes
// nothing (ErrNotificationsOff) and its settle sends the statements of a
// store with notifications that nobody subscribed to: no pg_notify, so
// waiting costs its commits nothing.
func TestNotificationsOff(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	settleStatements := func(opts ...idempgx.Option) (*idempgx.Store, func() int64) {
		c := &idempgxtest.Counter{}
		e := newEnv(t, newPool(t, 1, c), opts...)
		return e.Store, func() int64 {
			req := claimReq("alice", "off-"+randHex(4), "body", time.Minute)
			if _, err := e.Store.Claim(ctx, req); err != nil {
				t.Fatal(err)
			}
			_, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			before := c.Statements.Load()
			if err := tx.Settle(ctx, okResponse("{}")); err != nil {
				t.Fatal(err)
			}
			return c.Statements.Load() - before
		}
	}
	off, settleOff := settleStatements()
	if _, err := off.Subscribe(func(string) {}); !errors.Is(err, idemstore.ErrNotificationsOff) {
		t.Fatalf("Subscribe without WithNotifications: %v, want ErrNotificationsOff", err)
	}
	_, settleQuiet := settleStatements(idempgx.WithNotifications())
	settleOff() // the first settle of each warms its statement cache
	settleQuiet()
	if o, q := settleOff(), settleQuiet(); o != q {
		t.Fatalf("settle statements: %d without notifications after a refused Subscribe, %d with them unsubscribed; want the same", o, q)
	}
}
