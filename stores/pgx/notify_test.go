package idempgx_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/core/storetest"
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
	s := e.storeOn(t, pool, e.Schema+".idempotency_keys")
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
