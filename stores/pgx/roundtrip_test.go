package idempgx_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

func benchEnv(b *testing.B) (*env, *idempgxtest.Counter) {
	c := &idempgxtest.Counter{}
	pool := newPool(b, 1, c)
	return newEnv(b, pool), c
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
	b.ReportMetric(float64(c.Traced())/float64(n), "traced/op")
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
	b.ReportMetric(float64(c.Traced())/float64(n), "traced/op")
}
