package idemredistest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/core/storetest"
	idemredis "github.com/idemgo/idem/stores/redis"
)

// Peer is a storetest.Peer on e's prefix: a store on a client of its own,
// of the same kind as e's (standalone or Cluster), whose connections carry
// a client name no other client has, so that its subscribed connection can
// be found and killed.
func (e *Env) Peer(t testing.TB) storetest.Peer {
	t.Helper()
	name := "idemt-peer-" + RandHex(4)
	var c redis.UniversalClient
	switch e.Client.(type) {
	case *redis.ClusterClient:
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: ClusterAddrs(), PoolSize: 4, ClientName: name})
	default:
		c = redis.NewClient(&redis.Options{Addr: Addr(), PoolSize: 4, ClientName: name})
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := idemredis.New(c, idemredis.WithPrefix(e.Store.Prefix()))
	if err != nil {
		t.Fatal(err)
	}
	return storetest.Peer{
		Store: s,
		KillListener: func() error {
			n, err := subscribed(e.Client, name, true)
			if err == nil && n != 1 {
				err = fmt.Errorf("found %d subscribed connections named %s, want 1", n, name)
			}
			return err
		},
		Listening: func() int {
			n, err := subscribed(e.Client, name, false)
			if err != nil {
				t.Fatal(err)
			}
			return n
		},
		Acquired: func() int {
			st := c.PoolStats()
			return int(st.TotalConns) - int(st.IdleConns)
		},
	}
}

// subscribed counts, on every primary, the connections named name that
// are subscribed to a channel, and with kill kills them.
func subscribed(client redis.UniversalClient, name string, kill bool) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		mu sync.Mutex
		n  int
	)
	each := func(ctx context.Context, c *redis.Client) error {
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(list, "\n") {
			f := map[string]string{}
			for _, kv := range strings.Fields(line) {
				k, v, _ := strings.Cut(kv, "=")
				f[k] = v
			}
			if f["name"] != name || f["sub"] == "" || f["sub"] == "0" {
				continue
			}
			if kill {
				if err := c.ClientKillByFilter(ctx, "ID", f["id"]).Err(); err != nil {
					return err
				}
			}
			mu.Lock()
			n++
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachShard(ctx, each)
	case *redis.Client:
		err = each(ctx, c)
	}
	return n, err
}

// Eavesdrop subscribes to e's channel on a connection of the test's own
// and returns the payloads heard so far.
func (e *Env) Eavesdrop(t testing.TB) func() []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ps := e.Client.Subscribe(ctx, e.Store.Channel())
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		heard []string
		done  = make(chan struct{})
	)
	ch := ps.Channel()
	go func() {
		defer close(done)
		for m := range ch {
			mu.Lock()
			heard = append(heard, m.Payload)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ps.Close()
		<-done
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), heard...)
	}
}
