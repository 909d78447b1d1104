package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// TestRetryAfterIsWhenTheHolderLikelyFinishes plays, on a fake clock, a
// route whose handler takes a steady time (±10%) with the default 30s
// deadline, and a client that sends the same request while the first is
// running and then retries exactly when Retry-After says. It must get the
// replay on its first or second retry, having waited about as long as the
// holder still needed, not the 35s of the holder's worst case.
func TestRetryAfterIsWhenTheHolderLikelyFinishes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		steady time.Duration // the handler's usual duration
		after  time.Duration // when the client's first request arrives, after the holder's
	}{
		{800 * time.Millisecond, 100 * time.Millisecond},
		{time.Second, 0},
		{time.Second, 300 * time.Millisecond},
		{2500 * time.Millisecond, 2 * time.Second},
		{4 * time.Second, 0},
		{10 * time.Second, 9500 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%v/+%v", tc.steady, tc.after), func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(memstore.WithClock(clk.Now)), Clock: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			run := func(key string, d time.Duration) *idem.Attempt {
				t.Helper()
				att, resp := e.Begin(context.Background(), routed(key))
				if att == nil {
					t.Fatalf("%s: %+v, want a claim", key, resp)
				}
				return att
			}
			for i := range 20 { // the route's history: 0.9 to 1.1 times steady
				d := tc.steady * time.Duration(90+5*(i%5)) / 100
				att := run("warm-"+strconv.Itoa(i), d)
				clk.Add(d)
				att.Finish(idem.Result{Status: http.StatusCreated, Body: []byte("ok")})
			}

			holder := run("k", 0)
			t0, took := clk.Now(), tc.steady*110/100 // as slow as the route gets
			clk.Add(tc.after)
			var waited time.Duration
			for try := 0; ; try++ {
				att, resp := e.Begin(context.Background(), routed("k"))
				if att != nil {
					t.Fatal("the retry claimed the held key")
				}
				if resp.Header.Get(idem.ReplayedHeader) == "true" {
					if try == 0 || try > 2 {
						t.Fatalf("replayed on retry %d, want the first or second", try)
					}
					if left := took - tc.after; waited > left+2*time.Second {
						t.Fatalf("waited %v for a holder that needed %v more", waited, left)
					}
					t.Logf("replayed on retry %d after waiting %v (holder needed %v more; worst case 35s)", try, waited, took-tc.after)
					return
				}
				if resp.Status != http.StatusConflict || try > 2 {
					t.Fatalf("try %d: %d %s, want a 409 or the replay by the second retry", try, resp.Status, resp.Body)
				}
				ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
				if err != nil || ra < 1 {
					t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
				}
				wait := time.Duration(ra) * time.Second
				target, done := clk.Now().Add(wait), t0.Add(took)
				if holder != nil && !target.Before(done) {
					clk.Add(done.Sub(clk.Now())) // the holder finishes meanwhile
					holder.Finish(idem.Result{Status: http.StatusCreated, Body: []byte("ok")})
					holder = nil
				}
				clk.Add(target.Sub(clk.Now()))
				waited += wait
			}
		})
	}
}

func routed(key string) idem.Request {
	r := request("alice", key)
	r.Route = "POST /payments"
	return r
}

// TestRetryAfterBounds: a route without enough history (a cold route, as
// after every deploy) gets a retry in a second, not the worst case; a warm
// route gets its holders' likely finish, floored at 1s when the holder runs
// longer than its route usually does.
func TestRetryAfterBounds(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(memstore.WithClock(clk.Now)), Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	retryAfter := func(key string) string {
		_, resp := e.Begin(context.Background(), routed(key))
		if resp == nil || resp.Status != http.StatusConflict {
			t.Fatalf("%+v, want 409", resp)
		}
		return resp.Header.Get("Retry-After")
	}
	for i := range 7 { // one short of the history needed
		att, _ := e.Begin(context.Background(), routed("warm-"+strconv.Itoa(i)))
		clk.Add(3 * time.Second)
		att.Finish(idem.Result{Status: http.StatusCreated})
	}
	held, _ := e.Begin(context.Background(), routed("held"))
	defer held.Abort()
	if got := retryAfter("held"); got != "1" {
		t.Errorf("7 durations known: Retry-After %s, want 1 (a cold route), not the worst case 35", got)
	}
	att, _ := e.Begin(context.Background(), routed("warm-7"))
	clk.Add(3 * time.Second)
	att.Finish(idem.Result{Status: http.StatusCreated})
	fresh, _ := e.Begin(context.Background(), routed("fresh"))
	defer fresh.Abort()
	if got := retryAfter("fresh"); got != "3" {
		t.Errorf("8 durations of 3s, holder just begun: Retry-After %s, want 3", got)
	}
	clk.Add(5 * time.Second)
	if got := retryAfter("fresh"); got != "1" {
		t.Errorf("holder 5s past its route's usual: Retry-After %s, want the floor 1", got)
	}
}
