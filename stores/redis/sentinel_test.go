package idemredis_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/core/idemstore"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// startSentinel starts a Sentinel of the test's own that monitors primary
// as "idem" (quorum 1) and stops it, by its pid, when the test ends.
func startSentinel(t testing.TB, primary *server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustNil(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	mustNil(t, os.WriteFile(conf, []byte("port "+strconv.Itoa(port)+"\nbind 127.0.0.1\ndir "+dir+"\n"+
		"sentinel monitor idem 127.0.0.1 "+strconv.Itoa(primary.port)+" 1\n"+
		"sentinel down-after-milliseconds idem 1000\nsentinel failover-timeout idem 10000\n"), 0o600))
	cmd := exec.Command("redis-server", conf, "--sentinel")
	mustNil(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGKILL); _ = cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = sc.Close() })
	// Sentinel promotes only a replica it has heard from itself: wait until
	// it reports the replica's link to the primary as up.
	waitFor(t, func() bool {
		replicas, err := sc.Replicas(context.Background(), "idem").Result()
		return err == nil && len(replicas) == 1 && replicas[0]["flags"] == "slave" &&
			replicas[0]["master-link-status"] == "ok"
	})
	return addr
}

// TestSentinelFailover runs the store on a Sentinel failover client
// (redis.NewFailoverClient) over a primary and a replica of the test's own.
// A claim in progress and a settled key, both acknowledged by the replica
// (WithWaitReplicas), survive SENTINEL FAILOVER: after it the same client
// reaches the promoted replica, the settled key replays, the claim's holder
// settles it, and the scripts the new primary never ran come back through
// EVAL.
func TestSentinelFailover(t *testing.T) {
	ctx := testCtx(t)
	primary, replica := primaryWithReplica(t)
	sentinel := startSentinel(t, primary)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "idem", SentinelAddrs: []string{sentinel}})
	t.Cleanup(func() { _ = c.Close() })
	// WAIT's timeout is generous: this test is about the failover, and a
	// replica's acknowledgement can take longer than half a second on a
	// loaded machine; TestWaitReplicas proves WAIT's bound.
	env := idemredistest.NewEnv(t, c, idemredis.WithWaitReplicas(1, 2*time.Second))
	s := env.Store

	held := claimReq("alice", "held-"+idemredistest.RandHex(4), "body", time.Hour)
	done := claimReq("alice", "done-"+idemredistest.RandHex(4), "body", time.Hour)
	for _, r := range []idemstore.ClaimRequest{held, done} {
		if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v, %v", res, err)
		}
	}
	_, tx, _ := s.BeginTx(ctx, leaseOf(done))
	mustNil(t, tx.Settle(ctx, okOutcome(`{"id":"pay_1"}`)))
	// The settle is not waited for: make sure the replica has it too.
	mustNil(t, c.Do(ctx, "wait", 1, 1000).Err())

	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	t.Cleanup(func() { _ = sc.Close() })
	// NOGOODSLAVE until Sentinel has the replica's own INFO: ask again.
	waitFor(t, func() bool { return sc.Failover(ctx, "idem").Err() == nil })
	waitFor(t, func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, "idem").Result()
		return err == nil && addr[1] == strconv.Itoa(replica.port)
	})
	// Sentinel knowing is not the client knowing: wait until the client
	// has switched too (it drops its connections to the old primary when
	// it hears of the switch), or the replay below can still be answered
	// by the old primary.
	waitFor(t, func() bool {
		info, err := c.Info(ctx, "server").Result()
		return err == nil && strings.Contains(info, "tcp_port:"+strconv.Itoa(replica.port)+"\r")
	})
	cnt := &counter{}
	c.AddHook(cnt)
	cnt.recording.Store(true)
	var res idemstore.ClaimResult
	var err error
	waitFor(t, func() bool {
		res, err = s.Claim(ctx, claimReq("alice", done.Key, "body", time.Hour))
		return err == nil
	})
	if res.Claimed || res.Record.Response == nil || string(res.Record.Response.Body) != `{"id":"pay_1"}` {
		t.Fatalf("replay after the failover: %+v", res)
	}
	_, tx, _ = s.BeginTx(ctx, leaseOf(held))
	mustNil(t, tx.Settle(ctx, okOutcome(`{"id":"pay_2"}`)))
	rec, err := s.Get(ctx, "alice", held.Key)
	if err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("the claim held across the failover: %+v, %v", rec, err)
	}
	cnt.recording.Store(false)
	if !slices.Contains(cnt.commands, "eval") {
		t.Fatalf("the new primary had the scripts cached already? commands %v", cnt.commands)
	}
	info, err := replica.client(t, nil).Info(ctx, "replication").Result()
	mustNil(t, err)
	if !strings.Contains(info, "role:master") {
		t.Fatalf("the replica was not promoted: %s", info)
	}
	// Check reaches the new primary (the version, the scripts). Whether the
	// old primary has rejoined as its replica yet, which WithWaitReplicas
	// would also ask, is Sentinel's business and can take a while.
	plain, err := idemredis.New(c, idemredis.WithPrefix(s.Prefix()))
	mustNil(t, err)
	mustNil(t, plain.Check(ctx))
	t.Logf("after SENTINEL FAILOVER to %s: the settled key replays, the held claim settles on the new primary, the scripts came back through EVAL", replica.addr())
}
