package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/redis/go-redis/v9"
)

// TestRedisRecordLost: Redis loses a settled record (a restart without
// persistence, an eviction). The retry then runs the handler again, and the
// unique downstream-key column turns its write into a read of the payment
// the first attempt wrote: one payment, the same answer.
func TestRedisRecordLost(t *testing.T) {
	t.Parallel()
	args, _ := storeArgs(t, "redis")
	p := startService(t, append(args, "-simulate-failures")...)
	acct, key := account(t), "lost-"+randHex(4)
	first := do(t, "POST", p.base+"/payments", acct, key, payBody)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first POST: %v", first)
	}

	o, err := redis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	defer c.Close()
	st, err := idemredis.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := c.Del(ctx, st.RecordKey(acct, key)).Result(); err != nil || n != 1 {
		t.Fatalf("deleting the record %s: %d deleted, %v", st.RecordKey(acct, key), n, err)
	}

	// A failure drill on the re-run must not delete the payment: another
	// attempt wrote it, and its 201 was answered.
	if r := do(t, "POST", p.base+"/payments", acct, key, payBody, SimulateHeader, "transient"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("transient drill on the re-run: %v, want 503", r)
	}
	wantPayments(t, p.base, acct, 1)

	again := do(t, "POST", p.base+"/payments", acct, key, payBody)
	if again.status != http.StatusCreated || again.replayed() {
		t.Fatalf("retry after the record was lost: %v replayed=%v, want a fresh 201 (the handler ran again)", again, again.replayed())
	}
	if !bytes.Equal(again.body, first.body) || again.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("the re-run answered %s, want the first payment %s", again.body, first.body)
	}
	wantPayments(t, p.base, acct, 1)
	if r := do(t, "POST", p.base+"/payments", acct, key, payBody); r.status != http.StatusCreated || !r.replayed() ||
		!bytes.Equal(r.body, first.body) {
		t.Fatalf("retry after the re-run: %v, want the replay", r)
	}

	// Lost again, and now the key comes with another body: the record that
	// would have answered 422 is gone, so the payment row must.
	if n, err := c.Del(ctx, st.RecordKey(acct, key)).Result(); err != nil || n != 1 {
		t.Fatalf("deleting the record again: %d deleted, %v", n, err)
	}
	other := do(t, "POST", p.base+"/payments", acct, key, `{"amount": 9900, "currency": "EUR"}`)
	if other.status != http.StatusUnprocessableEntity || !strings.HasSuffix(other.problemType(), "#key-reused") {
		t.Fatalf("another body after the record was lost: %v, want a 422 key-reused problem", other)
	}
	wantPayments(t, p.base, acct, 1)
}

// TestRedisCluster runs the contract's cases on the three-node Redis
// Cluster that scripts/services.sh starts (IDEM_REDIS_CLUSTER, default
// 127.0.0.1:7001-7003), with -dsn naming its nodes.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	nodes := os.Getenv("IDEM_REDIS_CLUSTER")
	if nodes == "" {
		nodes = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
	}
	addrs := strings.Split(nodes, ",")
	dsn := "redis://" + addrs[0]
	for i, a := range addrs[1:] {
		dsn += map[bool]string{true: "?", false: "&"}[i == 0] + "addr=" + a
	}
	p := startService(t, "-store", "redis", "-dsn", dsn, "-payments-db", filepath.Join(t.TempDir(), "payments.db"),
		"-handler-delay", contractDelay.String(), "-simulate-failures")
	if !strings.Contains(p.logs.String(), "redis cluster") {
		t.Fatalf("the service did not start on the Cluster: %s", p.logs)
	}
	t.Run("replay", func(t *testing.T) { testReplay(t, p.base) })
	t.Run("concurrent_retries", func(t *testing.T) { testConcurrent(t, p.base, "redis") })
	t.Run("drill_transient", func(t *testing.T) { testDrill(t, p.base, "transient", http.StatusServiceUnavailable) })
	t.Run("drill_panic", func(t *testing.T) { testDrill(t, p.base, "panic", http.StatusInternalServerError) })
}
