// Package idemredistest makes idemredis stores for the conformance suites
// (core/storetest, core/adaptertest): NewBackend is a storetest.Backend on
// a fresh key prefix of the standalone Redis that IDEM_REDIS_ADDR names,
// NewClusterBackend one on the Redis Cluster that IDEM_REDIS_CLUSTER names;
// the prefix's keys are deleted when the test ends. An unreachable server
// fails the test with t.Fatal and says how to start it; it never skips, so
// a store that was never tested cannot look green.
//
// The business writes of these Backends stand for the application's own
// database, which is not Redis: they are kept in the test process, counted
// per id, and not rolled back by anything, as the handler's writes are not
// with a Redis store. The Backends declare that with
// storetest.Backend.NoSharedTx (and SelfExpiring: Redis expires records
// itself).
package idemredistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemredis "github.com/idemgo/idem/stores/redis"
)

// DefaultAddr is the standalone server the tests use when IDEM_REDIS_ADDR
// is not set.
const DefaultAddr = "127.0.0.1:6379"

// DefaultClusterAddrs are the Cluster nodes the tests use when
// IDEM_REDIS_CLUSTER is not set: the three-node Cluster that
// scripts/services.sh starts.
const DefaultClusterAddrs = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"

// howToStart is appended to every unreachable-server failure.
const howToStart = "start them with `make services` (scripts/services.sh starts Redis on :6379 and a three-node Cluster on :7001-7003)"

// Addr returns IDEM_REDIS_ADDR, or DefaultAddr.
func Addr() string {
	if v := os.Getenv("IDEM_REDIS_ADDR"); v != "" {
		return v
	}
	return DefaultAddr
}

// ClusterAddrs returns the comma-separated IDEM_REDIS_CLUSTER, or
// DefaultClusterAddrs, as a list.
func ClusterAddrs() []string {
	v := os.Getenv("IDEM_REDIS_CLUSTER")
	if v == "" {
		v = DefaultClusterAddrs
	}
	return strings.Split(v, ",")
}

// NewClient returns a client of the standalone server, closed when t
// ends, and fails t when the server does not answer.
func NewClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(), PoolSize: 16})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("idemredis tests need a reachable Redis at %s (IDEM_REDIS_ADDR): %v; %s", Addr(), err, howToStart)
	}
	return c
}

// NewClusterClient returns a client of the Cluster, closed when t ends, and
// fails t when the Cluster does not answer or is not healthy.
func NewClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: ClusterAddrs(), PoolSize: 16})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err == nil && !strings.Contains(info, "cluster_state:ok") {
		err = errors.New("cluster_state is not ok")
	}
	if err == nil {
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() })
	}
	if err != nil {
		t.Fatalf("idemredis tests need a healthy Redis Cluster at %v (IDEM_REDIS_CLUSTER): %v; %s", ClusterAddrs(), err, howToStart)
	}
	return c
}

// RandHex returns n random bytes in hex, for names no other test uses.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Env is a store on a fresh key prefix plus the business writes the suites
// count.
type Env struct {
	// Client is the client the store uses.
	Client redis.UniversalClient
	// Store is the store, checked (its scripts loaded).
	Store *idemredis.Store

	mu      sync.Mutex
	effects map[string]int
}

// NewEnv makes a store on client under a fresh prefix (opts follow the
// prefix option, so they may override it), runs Check, and deletes the
// prefix's keys when t ends.
func NewEnv(t testing.TB, client redis.UniversalClient, opts ...idemredis.Option) *Env {
	t.Helper()
	prefix := "idemt:" + RandHex(6) + ":"
	opts = append([]idemredis.Option{idemredis.WithPrefix(prefix)}, opts...)
	s, err := idemredis.New(client, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("idemredis: Check: %v; %s", err, howToStart)
	}
	t.Cleanup(func() { DeletePrefix(t, client, s.Prefix()) })
	return &Env{Client: client, Store: s, effects: map[string]int{}}
}

// DeletePrefix deletes every key starting with prefix on every primary,
// with SCAN (tests only: the store itself never scans).
func DeletePrefix(t testing.TB, client redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var batch []string
		flush := func() error {
			// One UNLINK per key: on a Cluster node the keys of a batch
			// are in many slots.
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range batch {
					p.Unlink(ctx, k)
				}
				return nil
			})
			batch = batch[:0]
			return err
		}
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 500 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		if len(batch) > 0 {
			return flush()
		}
		return nil
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, del)
	case *redis.Client:
		err = del(ctx, c)
	}
	if err != nil {
		t.Errorf("delete test keys %s*: %v", prefix, err)
	}
}

// WriteEffect records one business write for id, as a handler does with
// a Redis store: it needs the handle (idemredis.Tx) and writes outside
// Redis, with nothing to roll it back.
func (e *Env) WriteEffect(ctx context.Context, id string) error {
	if _, ok := idemredis.Tx(ctx); !ok {
		return errors.New("no idemredis handle in context")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.effects[id]++
	return nil
}

// CountEffects returns the number of business writes recorded for id.
func (e *Env) CountEffects(_ context.Context, id string) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.effects[id], nil
}

// Backend returns the suites' view of e.
func (e *Env) Backend() storetest.Backend {
	return storetest.Backend{
		Store:        e.Store,
		WriteEffect:  e.WriteEffect,
		CountEffects: e.CountEffects,
		NoSharedTx:   true,
		SelfExpiring: true,
		NoNonce:      true,
		Unreachable:  unreachable,
		Peer:         e.Peer,
		Eavesdrop:    e.Eavesdrop,
	}
}

// unreachable is a store on a port where no server listens.
func unreachable(t testing.TB) idemstore.Store {
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = down.Close() })
	s, err := idemredis.New(down)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// NewBackend is a storetest.NewBackend on the standalone server.
func NewBackend(t testing.TB) storetest.Backend {
	t.Helper()
	return NewEnv(t, NewClient(t)).Backend()
}

// NewClusterBackend is a storetest.NewBackend on the Cluster.
func NewClusterBackend(t testing.TB) storetest.Backend {
	t.Helper()
	return NewEnv(t, NewClusterClient(t)).Backend()
}

var (
	_ storetest.NewBackend = NewBackend
	_ storetest.NewBackend = NewClusterBackend
)
