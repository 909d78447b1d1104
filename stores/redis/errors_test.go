package idemredis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestErrorsAreClassified: an unreachable server is transient; a key under
// the store's prefix that the store did not write (another program's data)
// is a misconfiguration; both keep the store's prefix and reach the
// driver's error.
func TestErrorsAreClassified(t *testing.T) {
	ctx := testCtx(t)
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer down.Close()
	s, err := idemredis.New(down)
	mustNil(t, err)
	if err := s.Check(ctx); !errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("Check on a closed port: %v, want idemstore.ErrTransient", err)
	}
	_, err = s.Claim(ctx, claimReq("alice", "k", "body", time.Hour))
	if !errors.Is(err, idemstore.ErrTransient) || err.Error()[:len("idemredis: claim: ")] != "idemredis: claim: " {
		t.Fatalf("claim on a closed port: %v, want idemredis: claim: … idemstore.ErrTransient", err)
	}

	env := idemredistest.NewEnv(t, idemredistest.NewClient(t))
	c := env.Client
	mustNil(t, c.Set(ctx, env.Store.RecordKey("alice", "string"), "someone else's", time.Minute).Err())
	_, err = env.Store.Claim(ctx, claimReq("alice", "string", "body", time.Hour))
	var rerr redis.Error
	if !errors.Is(err, idem.ErrMisconfigured) || !errors.As(err, &rerr) {
		t.Fatalf("claim over a string key: %v, want idem.ErrMisconfigured reaching the redis.Error", err)
	}
	mustNil(t, c.HSet(ctx, env.Store.RecordKey("alice", "garbage"), "s", "weird", "x", "1").Err())
	if _, err := env.Store.Get(ctx, "alice", "garbage"); !errors.Is(err, idemredis.ErrCorruptRecord) || !errors.Is(err, idem.ErrMisconfigured) {
		t.Fatalf("Get of a hash the store did not write: %v, want ErrCorruptRecord and idem.ErrMisconfigured", err)
	}
}
