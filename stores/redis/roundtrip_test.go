package idemredis_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestServerClock: no argument the store sends carries the application's
// clock (every time is the server's TIME, read inside the scripts), and the
// claim's Now is the server's time.
func TestServerClock(t *testing.T) {
	ctx := testCtx(t)
	c := idemredistest.NewClient(t)
	cnt := &counter{}
	c.AddHook(cnt)
	s := idemredistest.NewEnv(t, c).Store

	var serverNow time.Time
	cnt.measure(func() {
		req := claimReq("alice", "clock-"+idemredistest.RandHex(4), "body", time.Millisecond)
		res, err := s.Claim(ctx, req)
		mustNil(t, err)
		tm, err := c.Time(ctx).Result()
		mustNil(t, err)
		serverNow = tm
		if d := serverNow.Sub(res.Now); d < 0 || d > time.Second {
			t.Fatalf("claim's Now %v is not the server's clock %v", res.Now, serverNow)
		}
		time.Sleep(2 * time.Millisecond)
		taker := claimReq("alice", req.Key, "body", time.Millisecond)
		if res, err := s.Claim(ctx, taker); err != nil || !res.Reclaimed {
			t.Fatalf("takeover: %+v, %v", res, err)
		}
		_, tx, _ := s.BeginTx(ctx, leaseOf(taker))
		mustNil(t, tx.Settle(ctx, okOutcome("{}")))
		other := claimReq("alice", "clock2-"+idemredistest.RandHex(4), "body", time.Millisecond)
		_, err = s.Claim(ctx, other)
		mustNil(t, err)
		mustNil(t, s.Release(ctx, leaseOf(other)))
		_, err = s.ListStale(ctx, 10)
		mustNil(t, err)
	})
	now := time.Now()
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	for i, args := range cnt.args {
		if cnt.commands[i] == "time" {
			continue // the test's own
		}
		if cnt.commands[i] == "eval" {
			t.Fatalf("the store sent a script's source (EVAL) although Check loaded it: %v", cnt.commands)
		}
		for _, a := range args {
			var n float64
			switch v := a.(type) {
			case int64:
				n = float64(v)
			case int:
				n = float64(v)
			case string:
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					continue
				}
				n = f
			default:
				continue
			}
			for _, unit := range []time.Duration{time.Second, time.Millisecond, time.Microsecond, time.Nanosecond} {
				at := time.Unix(0, 0).Add(time.Duration(n * float64(unit)))
				if n > 0 && !math.IsInf(n, 0) && math.Abs(now.Sub(at).Hours()) < 24 {
					t.Fatalf("%s sent %v, which reads as the application's clock (%v): times must come from the server", cnt.commands[i], a, at)
				}
			}
		}
	}
	t.Logf("%d commands, no argument within a day of the application's clock", len(cnt.args))
}

// TestNewValidates: the constructor refuses what cannot work, naming it.
func TestNewValidates(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: idemredistest.Addr(), ReadTimeout: time.Second})
	defer c.Close()
	if _, err := idemredis.New(nil); err == nil {
		t.Error("New(nil) accepted")
	}
	for _, o := range []idemredis.Option{
		idemredis.WithPrefix("a{b"), idemredis.WithPrefix("}"), idemredis.WithPrefix(string(make([]byte, 65))),
		idemredis.WithWaitReplicas(-1, time.Second), idemredis.WithWaitReplicas(1, 0),
		idemredis.WithWaitReplicas(1, time.Second), // not shorter than ReadTimeout
	} {
		if _, err := idemredis.New(c, o); err == nil {
			t.Errorf("New accepted an invalid option")
		}
	}
	for _, o := range []idemredis.Option{idemredis.WithPrefix(""), idemredis.WithPrefix("billing:idem:"), idemredis.WithWaitReplicas(1, 500*time.Millisecond)} {
		if _, err := idemredis.New(c, o); err != nil {
			t.Errorf("New: %v", err)
		}
	}
	s, err := idemredis.New(c)
	mustNil(t, err)
	if s.Prefix() != idemredis.DefaultPrefix {
		t.Errorf("default prefix %q", s.Prefix())
	}
}
