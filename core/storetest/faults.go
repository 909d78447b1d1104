package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest/faultproxy"
)

// FaultTarget describes a store whose connections RunFaults cuts.
type FaultTarget struct {
	// Addr is the database's "host:port"; the proxy forwards to it.
	Addr string
	// Connect returns a Backend whose store and effect writes reach the
	// database through proxyAddr ("127.0.0.1:port") instead of Addr. Its
	// driver must send statement text with every execution (no cached
	// prepared statements), or the patterns below are never seen after
	// the first use.
	Connect func(t testing.TB, proxyAddr string) Backend
	// Claim, Commit and Effect are byte patterns unique to the claim
	// statement, the COMMIT of a settle and the business write, as they
	// appear on the wire.
	Claim, Commit, Effect []byte
	// Takeover and Release are byte patterns unique to the takeover of a
	// stale claim and to a release. With Release set, RunFaults also cuts
	// the connection under a claim, a takeover and a release, before the
	// server received it and after it ran it (its answer lost), and checks
	// that the store sends it again and recognises its own work: the
	// claim and the takeover are the caller's, a release that had run
	// answers idemstore.ErrLeaseLost and the key is free either way.
	Takeover, Release []byte
	// Begin is a byte pattern unique to the statement that begins the
	// handler's transaction. With it set, RunFaults also cuts the
	// connection as it goes out, before the server received it and after,
	// and checks that the transaction begins on another connection, with
	// the handler's first statement where it travels with BEGIN: the
	// attempt then settles as usual, with one effect.
	Begin []byte
}

// FaultLease is the lease RunFaults runs the engine with: a key whose
// holder lost its connection is blocked at most this long.
const FaultLease = 2 * time.Second

// faultKeys is the number of keys driven through each moment; override with
// IDEM_FAULT_KEYS.
func faultKeys() int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_FAULT_KEYS")); err == nil && n > 0 {
		return n
	}
	return 12
}

// RunFaults cuts the store's connections at each moment of a request —
// during the claim, after the business write and before the commit, and
// during the commit after the server received it (the ambiguous case) —
// for many keys, retries every key until it gets its 201, and proves by
// counting that no effect exists without its completed record, no
// completed record without its effect, every retry saw the same response,
// and no key stayed blocked longer than the lease.
func RunFaults(t *testing.T, target FaultTarget) {
	moments := []struct {
		name    string
		pattern func(FaultTarget) []byte
		when    faultproxy.When
		// ambiguous: the COMMIT reached the server, and its answer is
		// lost. Whether it ran depends on the server (PostgreSQL does not
		// always run a query string to its COMMIT once the client is
		// gone). A key whose record is completed right after
		// the attempt committed: unless its store resent the settle and
		// learned the outcome, the attempt cannot know that, so it is
		// answered 500 commit-failed, its release (fenced on the record
		// being in progress) must leave the completed record alone, and
		// the retry must get the replay, not run the handler again.
		ambiguous bool
	}{
		{"DuringClaim", func(f FaultTarget) []byte { return f.Claim }, faultproxy.Before, false},
		{"AfterClaimBeforeCommit", func(f FaultTarget) []byte { return f.Effect }, faultproxy.After, false},
		{"CommitNotReceived", func(f FaultTarget) []byte { return f.Commit }, faultproxy.Before, false},
		{"CommitReceivedAnswerLost", func(f FaultTarget) []byte { return f.Commit }, faultproxy.After, true},
	}
	if target.Release != nil {
		t.Run("Resent", func(t *testing.T) { testResent(t, target) })
	}
	if target.Begin != nil {
		t.Run("BeginOnAnotherConnection", func(t *testing.T) { testBeginResent(t, target) })
	}
	for _, m := range moments {
		t.Run(m.name, func(t *testing.T) {
			proxy, b := proxied(t, target)
			eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey,
				Store: b.Store, RequestTimeout: 500 * time.Millisecond, StoreTimeout: time.Second, Lease: FaultLease,
			})
			if err != nil {
				t.Fatal(err)
			}
			var longest time.Duration
			keys, cutsSeen, landed := faultKeys(), 0, 0
			for i := range keys {
				key := uniq(fmt.Sprintf("fault%d", i))
				fired := proxy.CutOn(m.pattern(target), m.when)
				first := attempt(eng, b, key)
				select {
				case <-fired:
					cutsSeen++
				default:
					proxy.Disarm()
					t.Fatalf("key %d: the %s cut never fired (first attempt answered %d): the pattern %q was not seen",
						i, m.name, first.Status, m.pattern(target))
				}
				committed := false
				if m.ambiguous {
					rec, err := b.Store.Get(context.Background(), "alice", key)
					committed = err == nil && rec.State == idemstore.StateCompleted
				}
				final, blocked := retryUntilDone(t, eng, b, key)
				longest = max(longest, blocked)
				if blocked > FaultLease+time.Second {
					t.Fatalf("key %d: blocked %v, lease is %v", i, blocked, FaultLease)
				}
				checkFaultOutcome(t, b, key, first, final)
				if committed {
					landed++
					checkLanded(t, key, first, final)
				}
			}
			t.Logf("%s: %d keys, %d cuts, %d connections cut, longest block %v (lease %v); every key: 1 effect, 1 completed record, identical responses",
				m.name, keys, cutsSeen, proxy.Cuts(), longest.Round(time.Millisecond), FaultLease)
			if m.ambiguous {
				t.Logf("%s: the COMMIT landed for %d of %d keys; each was answered 500 commit-failed (or 201 after a resent settle) and its retry replayed", m.name, landed, keys)
			}
		})
	}
}

// attempt runs one request for key through the engine with a handler that
// writes one business effect and answers 201.
func attempt(eng *idem.Engine, b Backend, key string) *idem.Response {
	att, resp := eng.Begin(context.Background(), idem.Request{
		Method: http.MethodPost, Path: "/payments", Principal: "alice", Key: key,
		ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`),
	})
	if att == nil {
		return resp
	}
	defer att.Abort()
	if err := b.WriteEffect(att.Context(), key); err != nil {
		return att.Finish(idem.Result{Status: http.StatusServiceUnavailable, Body: []byte(err.Error())})
	}
	return att.Finish(idem.Result{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   fmt.Appendf(nil, `{"id":%q,"at":%d}`, key, time.Now().UnixNano()),
	})
}

// retryUntilDone retries key until it gets a 201, and reports how long the
// key answered 409 (blocked).
func retryUntilDone(t *testing.T, eng *idem.Engine, b Backend, key string) (*idem.Response, time.Duration) {
	t.Helper()
	var blockedSince time.Time
	deadline := time.Now().Add(FaultLease + 10*time.Second)
	for time.Now().Before(deadline) {
		resp := attempt(eng, b, key)
		switch {
		case resp.Status == http.StatusCreated:
			if blockedSince.IsZero() {
				return resp, 0
			}
			return resp, time.Since(blockedSince)
		case resp.Status == http.StatusConflict:
			if blockedSince.IsZero() {
				blockedSince = time.Now()
			}
		case resp.Status >= 500:
			// Transient: a store error while the pool reconnects.
		default:
			t.Fatalf("retry of %s answered %d %s", key, resp.Status, resp.Body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("key %s never completed", key)
	return nil, 0
}

func checkFaultOutcome(t *testing.T, b Backend, key string, first, final *idem.Response) {
	t.Helper()
	n := effects(t, b, key)
	rec, err := b.Store.Get(context.Background(), "alice", key)
	if err != nil {
		t.Fatalf("%s: no record after completion: %v", key, err)
	}
	if n != 1 || rec.State != idemstore.StateCompleted {
		t.Fatalf("%s: %d effects and a %s record: want exactly one effect with its completed record", key, n, rec.State)
	}
	if !bytes.Equal(rec.Response.Body, final.Body) {
		t.Fatalf("%s: the retry's response %s differs from the stored %s", key, final.Body, rec.Response.Body)
	}
	if first.Status == http.StatusCreated && !bytes.Equal(first.Body, final.Body) {
		t.Fatalf("%s: the first attempt answered 201 %s but the record holds %s", key, first.Body, final.Body)
	}
}

// checkLanded: a first attempt whose COMMIT landed and whose answer was
// lost is answered 500 commit-failed (its outcome is unknown to it), and
// the retry replays the committed response.
func checkLanded(t *testing.T, key string, first, final *idem.Response) {
	t.Helper()
	var p struct{ Type idem.ProblemType }
	_ = json.Unmarshal(first.Body, &p)
	// A store whose client sends the lost settle again, and whose settle
	// answers a resend as its first run did (idemredis with go-redis's
	// retries), learns the outcome and answers 201; any other answer
	// than that or commit-failed hides an outcome that landed.
	recovered := first.Status == http.StatusCreated
	if !recovered && (first.Status != http.StatusInternalServerError || p.Type != idem.ProblemCommitFailed) {
		t.Fatalf("%s: the attempt whose COMMIT's answer was lost answered %d %s, want 500 %s (or 201 where the store resent the settle)",
			key, first.Status, first.Body, idem.ProblemCommitFailed)
	}
	if final.Header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("%s: the retry after a COMMIT that landed answered %d %s without %s: it ran the request again instead of replaying it",
			key, final.Status, final.Body, idem.ReplayedHeader)
	}
}

// proxied returns a fault proxy in front of target's server, closed when
// the test ends, and a Backend connected through it.
func proxied(t *testing.T, target FaultTarget) (*faultproxy.Proxy, Backend) {
	t.Helper()
	proxy, err := faultproxy.New(target.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	return proxy, target.Connect(t, proxy.Addr())
}

// testBeginResent: see FaultTarget.Begin.
func testBeginResent(t *testing.T, target FaultTarget) {
	proxy, b := proxied(t, target)
	ctx := ctxT(t)
	for _, cut := range []struct {
		name string
		when faultproxy.When
	}{{"cut before the server got BEGIN", faultproxy.Before}, {"cut after the server answered BEGIN", faultproxy.After}} {
		when := cut.name
		req := claimReq("alice", uniq("begin"), "body")
		mustClaim(t, b.Store, req)
		var (
			tx             idemstore.Tx
			beginErr, wErr error
		)
		// BEGIN goes out in BeginTx or with the handler's first statement.
		if !proxy.CutWhile(target.Begin, cut.when, time.Second, func() {
			var txCtx context.Context
			if txCtx, tx, beginErr = b.Store.BeginTx(ctx, leaseOf(req)); beginErr == nil {
				wErr = b.WriteEffect(txCtx, req.Key)
			}
		}) {
			t.Fatalf("%s: the cut on %q never fired", when, target.Begin)
		}
		if tx != nil {
			defer func() { _ = tx.Rollback(ctx) }() // after Settle: nothing to send
		}
		if beginErr != nil || wErr != nil {
			t.Fatalf("%s: a transaction begun over a connection cut as BEGIN went out: BeginTx %v, then the handler's write %v", when, beginErr, wErr)
		}
		if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("ok")}); err != nil {
			t.Fatalf("%s: settle after BEGIN went out again on another connection: %v", when, err)
		}
		if n := effects(t, b, req.Key); n != 1 {
			t.Fatalf("%s: %d effects, want 1", when, n)
		}
	}
}

// testResent: see FaultTarget.Takeover and Release.
func testResent(t *testing.T, target FaultTarget) {
	proxy, b := proxied(t, target)
	ctx := ctxT(t)
	var err error
	cut := func(pattern []byte, when faultproxy.When, fn func()) {
		t.Helper()
		if !proxy.CutWhile(pattern, when, time.Second, fn) {
			t.Fatalf("the cut on %q never fired", pattern)
		}
	}
	for _, when := range []faultproxy.When{faultproxy.Before, faultproxy.After} {
		for _, stale := range []bool{false, true} {
			key, pattern := uniq("cut"), target.Claim
			if stale {
				old := claimReq("alice", key, "body")
				old.Lease = time.Millisecond
				mustClaim(t, b.Store, old)
				time.Sleep(5 * time.Millisecond)
				pattern = target.Takeover
			}
			req := claimReq("alice", key, "body")
			var res idemstore.ClaimResult
			cut(pattern, when, func() { res, err = b.Store.Claim(ctx, req) })
			if err != nil || !res.Claimed || res.Reclaimed != stale || res.Record.LeaseToken != req.Token {
				t.Fatalf("claim cut %v (stale %v): %+v, %v; want the caller's, Reclaimed %v", when, stale, res, err, stale)
			}
			if rec := get(t, b, "alice", key); rec.State != idemstore.StateInProgress || rec.LeaseToken != req.Token {
				t.Fatalf("after the claim cut %v (stale %v) the record is %+v", when, stale, rec)
			}
		}
		req := claimReq("alice", uniq("rel"), "body")
		mustClaim(t, b.Store, req)
		cut(target.Release, when, func() { err = b.Store.Release(ctx, leaseOf(req)) })
		if when == faultproxy.Before && err != nil || when == faultproxy.After && !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("release cut %v: %v", when, err)
		}
		if rec, free := Free(t, b.Store, "alice", req.Key); !free {
			t.Fatalf("after the release cut %v the record is %+v", when, rec)
		}
	}
	t.Logf("%d cuts; every claim, takeover and release was sent again and recognised as the caller's", proxy.Cuts())
}
