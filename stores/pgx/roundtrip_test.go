package idempgx_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestReplayStatementWritesNothing: the claim statement, run on a settled
// key, neither assigns a transaction id nor writes WAL, which no other
// client of a shared cluster can blur: 200 runs in one transaction leave
// txid_current_if_assigned() NULL, and EXPLAIN (ANALYZE, WAL) shows no WAL
// record in any plan node. A control, the locking upsert (ON CONFLICT … DO
// UPDATE … WHERE false), shows that both see a row lock. (Replays through
// the store leaving the row untouched are core/storetest's
// ReplayWritesNothing.)
func TestReplayStatementWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 2, nil))
	ctx := testCtx(t)
	req := claimReq("alice", "replay-"+randHex(4), "body", time.Minute)
	if _, err := e.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := e.runAttempt(ctx, leaseOf(req), req.Key, "original"); err != nil {
		t.Fatal(err)
	}
	claim := []any{idempgx.ClaimSQL(e.Store), req.Principal, req.Key, fp("body"), randHex(16), "req", int64(3600e6), randHex(16), int64(60e6)}
	lock := []any{"INSERT INTO " + e.Store.Table() + ` AS t (principal, key, fingerprint, state, lease_token, nonce, lease_expires_at, expires_at)
		VALUES ($1, $2, $3, 'in_progress', 'x', 'x', now(), now() + interval '1 hour')
		ON CONFLICT (principal, key) DO UPDATE SET lease_token = EXCLUDED.lease_token
		WHERE t.state = 'in_progress' AND t.locked_at < now() - interval '1 hour'
		RETURNING t.state`, req.Principal, req.Key, fp("body")}
	assigned := func(stmt []any) bool {
		tx, err := e.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for range 200 {
			rows, err := tx.Query(ctx, stmt[0].(string), stmt[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		}
		var xid *int64
		if err := tx.QueryRow(ctx, "SELECT txid_current_if_assigned()").Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid != nil
	}
	walRecords := func(stmt []any) (n int64) {
		var plan []byte
		if err := e.Pool.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "+stmt[0].(string), stmt[1:]...).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		var walk func(any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				if r, ok := v["WAL Records"].(float64); ok {
					n += int64(r)
				}
				for _, c := range v {
					walk(c)
				}
			case []any:
				for _, c := range v {
					walk(c)
				}
			}
		}
		var doc any
		if err := json.Unmarshal(plan, &doc); err != nil {
			t.Fatal(err)
		}
		walk(doc)
		return n
	}
	if assigned(claim) || walRecords(claim) != 0 {
		t.Fatal("the claim statement on a settled key assigned a transaction id or wrote WAL")
	}
	if !assigned(lock) || walRecords(lock) == 0 {
		t.Fatal("control: the locking upsert assigned no transaction id or wrote no WAL; the checks cannot see a write")
	}
}

// benchEnv is an env on one connection whose round trips c counts, with
// no tracer: tracing costs what the benchmarks do not measure.
func benchEnv(b *testing.B) (*env, *idempgxtest.Counter) {
	c := &idempgxtest.Counter{}
	cfg := idempgxtest.PoolConfig(b, 1)
	c.CountTurns(cfg)
	return newEnv(b, idempgxtest.OpenPool(b, cfg)), c
}

// BenchmarkFirstRequest: the claim, BEGIN, the handler's insert, the settle
// with its COMMIT: one connection, sequential. The claim commits
// asynchronously (async) or, as with Config.DurableClaims, waits for its
// WAL flush (durable): the difference is what a durable claim costs.
func BenchmarkFirstRequest(b *testing.B) {
	b.Run("async", func(b *testing.B) { benchmarkFirstRequest(b, false) })
	b.Run("durable", func(b *testing.B) { benchmarkFirstRequest(b, true) })
}

func benchmarkFirstRequest(b *testing.B, durable bool) {
	e, c := benchEnv(b)
	ctx := context.Background()
	run := func(key string) {
		req := claimReq("alice", key, "body", time.Minute)
		req.Durable = durable
		res, err := e.Store.Claim(ctx, req)
		if err != nil || !res.Claimed {
			b.Fatalf("claim: %+v %v", res, err)
		}
		if err := e.runAttempt(ctx, leaseOf(req), key, `{"id":"p_1","status":"succeeded"}`); err != nil {
			b.Fatal(err)
		}
	}
	run("warm-" + randHex(4))
	prefix := randHex(4)
	c.Reset()
	n := 0
	for b.Loop() {
		run(prefix + "-" + strconv.Itoa(n))
		n++
	}
	b.ReportMetric(float64(c.Turns.Load())/float64(n), "roundtrips/op")
}

// BenchmarkReplay: the claim of a settled key.
func BenchmarkReplay(b *testing.B) {
	e, c := benchEnv(b)
	ctx := context.Background()
	key := "replay-" + randHex(4)
	req := claimReq("alice", key, "body", time.Minute)
	if _, err := e.Store.Claim(ctx, req); err != nil {
		b.Fatal(err)
	}
	if err := e.runAttempt(ctx, leaseOf(req), key, `{"id":"p_1","status":"succeeded"}`); err != nil {
		b.Fatal(err)
	}
	_, _ = e.Store.Claim(ctx, claimReq("alice", key, "body", time.Minute))
	c.Reset()
	n := 0
	for b.Loop() {
		n++
		res, err := e.Store.Claim(ctx, claimReq("alice", key, "body", time.Minute))
		if err != nil || res.Claimed {
			b.Fatalf("replay: %+v %v", res, err)
		}
	}
	b.ReportMetric(float64(c.Turns.Load())/float64(n), "roundtrips/op")
}
