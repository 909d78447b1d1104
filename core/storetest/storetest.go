package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
)

// Lease is the lease the suite uses where it waits for expiry. Stores whose
// clock is coarse may need it longer; it is kept short so the suite is fast.
const Lease = 400 * time.Millisecond

// Run runs the conformance suite against the Backends newBackend makes.
// The number of rounds of the contention test can be raised with
// IDEM_STORETEST_ROUNDS (default 200).
func Run(t *testing.T, newBackend NewBackend) {
	runCases(t, newBackend, suite())
	RunHostile(t, newBackend)
}

// RunCases runs the cases of Run named in names (as in the subtest names
// Run reports, without the hostile section), for a store that proves a
// few of them again under another configuration: another driver mode, a
// pooler in between. It fails t on a name the suite does not have.
func RunCases(t *testing.T, newBackend NewBackend, names ...string) {
	all := suite()
	var picked []suiteCase
	for _, name := range names {
		i := slices.IndexFunc(all, func(c suiteCase) bool { return c.name == name })
		if i < 0 {
			t.Fatalf("storetest: no case %q", name)
		}
		picked = append(picked, all[i])
	}
	runCases(t, newBackend, picked)
}

type suiteCase struct {
	name string
	fn   func(*testing.T, Backend)
}

func runCases(t *testing.T, newBackend NewBackend, cases []suiteCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t)
			if b.Store == nil || b.WriteEffect == nil || b.CountEffects == nil || (b.PoisonTx == nil && !b.NoSharedTx) {
				t.Fatal("storetest: Backend must set Store, WriteEffect, CountEffects and PoisonTx (PoisonTx may be nil with NoSharedTx)")
			}
			tc.fn(t, b)
		})
	}
}

func suite() []suiteCase {
	return []suiteCase{
		{"ClaimNewKey", testClaimNewKey},
		{"ClaimExistingWritesNothing", testClaimExisting},
		{"ConcurrentClaimsExactlyOnce", testConcurrentClaims},
		{"TakeoverOnlyAfterLease", testTakeoverOnlyAfterLease},
		{"TakeoverNeedsSameFingerprint", testTakeoverNeedsSameFingerprint},
		{"NonceKeptByTakeoverOnly", testNonce},
		{"ConcurrentTakeoverExactlyOnce", testConcurrentTakeover},
		{"StaleHolderSettleIsFenced", testStaleHolderFenced},
		{"ReleaseKeepsNonceAndIsFenced", testReleaseFenced},
		{"ForeignEndDoesNotWait", testForeignEndDoesNotWait},
		{"KeepMarksUncertainAndEndsTheLease", testKeep},
		{"LeaseDeadlineIsTheRecordsOwn", testLeaseDeadline},
		{"ExpiredRecordIsAbsent", testExpiredRecordAbsent},
		{"FailedCommitStoresNothing", testFailedCommit},
		{"RollbackLeavesClaimInProgress", testRollback},
		{"SettleFailedOutcome", testSettleFailed},
		{"PrincipalsAreIsolated", testPrincipalsIsolated},
		{"GetMissing", testGetMissing},
		{"PurgeExpired", testPurgeExpired},
		{"ConcurrentPurgersDeleteOnce", testConcurrentPurge},
		{"SweepersUnderLiveTraffic", testSweepersUnderTraffic},
		{"ListStale", testListStale},
		{"SweeperAndRetryRaceForAStaleClaim", testSweeperRacesRetry},
		{"Stats", testStats},
		{"ResponseRoundTrip", testResponseRoundTrip},
		{"RequestIDBound", testRequestIDBound},
		{"TakeoverRacingSettle", testTakeoverRacingSettle},
		{"PurgeRacingReplacement", testPurgeRacingReplacement},
		{"ListStaleByLeaseDeadline", testListStaleByLeaseDeadline},
		{"FailedAttemptsLeaveNothing", testFailedAttempts},
		{"TxContext", testTxContext},
		{"ConnectionLost", testConnectionLost},
		{"Syncer", testSyncer},
		{"SyncBehindAnOpenWriter", testSyncBehindOpenWriter},
		{"RoundTrips", testRoundTrips},
		{"ReplayWritesNothing", testReplayWritesNothing},
		{"Pool", testPool},
		{"AbandonedHolder", testAbandonedHolder},
		{"BoundedWaits", testBoundedWaits},
		{"Durable", testDurable},
		{"SessionKeepsDurability", testSessionKeepsDurability},
		{"Misconfigured", testMisconfigured},
		{"Unreachable", testUnreachable},
		{"SessionLeftBehind", testSessionLeftBehind},
		{"ClaimBounds", testClaimBounds},
		{"FrameworkContext", testFrameworkContext},
		{"NotifyWakesPeers", testNotifyWakesPeers},
		{"NotifyStop", testNotifyStop},
		{"NotifyListenerOutsidePool", testNotifyOutsidePool},
		{"NotifyAfterReconnect", testNotifyReconnect},
		{"NotifyOnlyWhenSubscribed", testNotifyOnlyWhenSubscribed},
		{"WaitInFlight", testWaitInFlight},
	}
}

// needsSharedTx skips the running test or subtest, saying why, when the
// backend's store shares no transaction with the handler: what it checks
// cannot hold there, and the store documents what the handler does instead.
func needsSharedTx(t *testing.T, b Backend, what string) {
	t.Helper()
	if b.NoSharedTx {
		t.Skip("not applicable: the store shares no transaction with the handler (Backend.NoSharedTx), so " + what)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func uniq(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// fingerprint is a fingerprint as the engine makes it, FingerprintSize
// bytes, so that a store whose schema assumes another length fails.
func fingerprint(s string) []byte {
	return idemadapter.Fingerprint(FingerprintKey, "POST", "/", "storetest", "text/plain", []byte(s), nil)
}

func token() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func claimReq(principal, key, fp string) idemstore.ClaimRequest {
	return idemstore.ClaimRequest{
		Principal: principal, Key: key, Fingerprint: fingerprint(fp), Token: token(), Nonce: token(),
		RequestID: uniq("req"), Lease: Lease, Retention: time.Hour,
	}
}

func leaseOf(r idemstore.ClaimRequest) idemstore.Lease {
	return idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token}
}

func mustClaim(t testing.TB, s idemstore.Store, req idemstore.ClaimRequest) idemstore.ClaimResult {
	t.Helper()
	res, err := s.Claim(ctxT(t), req)
	if err != nil {
		t.Fatalf("Claim(%s/%s): %v", req.Principal, req.Key, err)
	}
	return res
}

func okResponse(body string) idem.Response {
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/" + body}},
		Body:   []byte(`{"id":"` + body + `"}`),
	}
}

// settleWithEffect begins a transaction for lease, writes a business effect
// named id in it and settles with resp.
func settleWithEffect(ctx context.Context, b Backend, lease idemstore.Lease, id string, resp idem.Response) error {
	txCtx, tx, err := b.Store.BeginTx(ctx, lease)
	if err != nil {
		return fmt.Errorf("BeginTx: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := b.WriteEffect(txCtx, id); err != nil {
		return fmt.Errorf("WriteEffect: %w", err)
	}
	return tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: resp})
}

// settleFailed begins a transaction for lease and settles it failed with a
// stored 400.
func settleFailed(ctx context.Context, b Backend, lease idemstore.Lease) error {
	_, tx, err := b.Store.BeginTx(ctx, lease)
	if err != nil {
		return fmt.Errorf("BeginTx: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateFailed, Response: idem.Response{Status: http.StatusBadRequest}})
}

// claimAndBegin claims a fresh key for alice and begins its transaction.
func claimAndBegin(t testing.TB, b Backend) (idemstore.ClaimRequest, context.Context, idemstore.Tx) {
	t.Helper()
	req := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, req)
	txCtx, tx, err := b.Store.BeginTx(ctxT(t), leaseOf(req))
	if err != nil {
		t.Fatalf("BeginTx: %v", err)
	}
	return req, txCtx, tx
}

func effects(t testing.TB, b Backend, id string) int {
	t.Helper()
	n, err := b.CountEffects(ctxT(t), id)
	if err != nil {
		t.Fatalf("CountEffects(%s): %v", id, err)
	}
	return n
}

func get(t testing.TB, b Backend, principal, key string) idem.Record {
	t.Helper()
	rec, err := b.Store.Get(ctxT(t), principal, key)
	if err != nil {
		t.Fatalf("Get(%s/%s): %v", principal, key, err)
	}
	return rec
}

func testClaimNewKey(t *testing.T, b Backend) {
	req := claimReq("alice", uniq("k"), "body")
	res := mustClaim(t, b.Store, req)
	if !res.Claimed || res.Reclaimed {
		t.Fatalf("first claim: Claimed=%v Reclaimed=%v, want true false", res.Claimed, res.Reclaimed)
	}
	rec := res.Record
	if rec.State != idemstore.StateInProgress || rec.LeaseToken != req.Token || !bytes.Equal(rec.Fingerprint, req.Fingerprint) {
		t.Fatalf("claimed record = %+v, want in_progress with the request's token and fingerprint", rec)
	}
	if res.Now.IsZero() || rec.LockedAt.After(res.Now) || rec.ExpiresAt.Before(res.Now.Add(59*time.Minute)) {
		t.Fatalf("times: now=%v locked_at=%v expires_at=%v; want locked_at <= now, expires_at ≈ now+1h",
			res.Now, rec.LockedAt, rec.ExpiresAt)
	}
	if d := time.Since(res.Now); d > time.Minute || d < -time.Minute {
		t.Fatalf("store clock %v is %v away from this machine's", res.Now, d)
	}
	stored := get(t, b, "alice", req.Key)
	if stored.State != idemstore.StateInProgress || stored.LeaseToken != req.Token || stored.RequestID != req.RequestID {
		t.Fatalf("Get after claim = %+v", stored)
	}
}

func testClaimExisting(t *testing.T, b Backend) {
	first := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, first)
	second := claimReq("alice", first.Key, "body")
	res := mustClaim(t, b.Store, second)
	if res.Claimed {
		t.Fatal("second claim of a live key claimed it")
	}
	if res.Record.LeaseToken != first.Token || res.Record.State != idemstore.StateInProgress {
		t.Fatalf("second claim returned %+v, want the first holder's in-progress record", res.Record)
	}
	// The first holder still holds the key: its settle goes through.
	if err := settleWithEffect(ctxT(t), b, leaseOf(first), first.Key, okResponse("p1")); err != nil {
		t.Fatalf("first holder's settle after a concurrent claim: %v", err)
	}
	res = mustClaim(t, b.Store, claimReq("alice", first.Key, "body"))
	if res.Claimed || res.Record.State != idemstore.StateCompleted || res.Record.Response == nil {
		t.Fatalf("claim after settle = %+v, want the completed record", res)
	}
}

// rounds is how many rounds b's race cases run: Backend.Rounds, else
// IDEM_STORETEST_ROUNDS, else 200.
func rounds(b Backend) int {
	if b.Rounds > 0 {
		return b.Rounds
	}
	if n, err := strconv.Atoi(os.Getenv("IDEM_STORETEST_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 200
}

func testConcurrentClaims(t *testing.T, b Backend) {
	const goroutines = 16
	ctx := ctxT(t)
	n := rounds(b)
	var lost atomic.Int64
	for round := range n {
		key := uniq(fmt.Sprintf("race%d", round))
		if round%2 == 1 {
			// Every other round races for a released record instead of
			// an absent key: the claims that find it must still let one win.
			first := claimReq("alice", key, "same body")
			mustClaim(t, b.Store, first)
			if err := b.Store.Release(ctx, leaseOf(first)); err != nil {
				t.Fatalf("round %d: release: %v", round, err)
			}
		}
		var (
			wg      sync.WaitGroup
			winners atomic.Int64
			start   = make(chan struct{})
			errs    = make(chan error, goroutines)
		)
		for range goroutines {
			wg.Go(func() {
				req := claimReq("alice", key, "same body")
				// A long lease: a winner slowed down by a loaded machine
				// must not be taken over, which would be the fence working
				// rather than a second claim.
				req.Lease = time.Minute
				<-start
				res, err := b.Store.Claim(ctx, req)
				if err != nil {
					if errors.Is(err, idemstore.ErrTransient) {
						lost.Add(1) // allowed: the client retries
						return
					}
					errs <- err
					return
				}
				if !res.Claimed {
					return
				}
				winners.Add(1)
				errs <- settleWithEffect(ctx, b, leaseOf(req), key, okResponse(key))
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if w := winners.Load(); w != 1 && !(w == 0 && lost.Load() > 0) {
			t.Fatalf("round %d: %d goroutines claimed the same key, want exactly 1", round, w)
		}
		if winners.Load() == 1 {
			if got := effects(t, b, key); got != 1 {
				t.Fatalf("round %d: %d committed effects, want 1", round, got)
			}
			if rec := get(t, b, "alice", key); rec.State != idemstore.StateCompleted {
				t.Fatalf("round %d: record left %s", round, rec.State)
			}
		}
	}
	t.Logf("%d rounds × %d goroutines (every other one on a released record): exactly one winner each; %d transient claim errors", n, goroutines, lost.Load())
}

func testTakeoverOnlyAfterLease(t *testing.T, b Backend) {
	first := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, first)
	early := claimReq("alice", first.Key, "body")
	if res := mustClaim(t, b.Store, early); res.Claimed {
		t.Fatal("a live lease was taken over before it expired")
	}
	time.Sleep(Lease + 150*time.Millisecond)
	late := claimReq("alice", first.Key, "body")
	res := mustClaim(t, b.Store, late)
	if !res.Claimed || !res.Reclaimed {
		t.Fatalf("claim after the lease expired: Claimed=%v Reclaimed=%v, want both", res.Claimed, res.Reclaimed)
	}
	if res.Record.LeaseToken != late.Token || res.Record.State != idemstore.StateInProgress {
		t.Fatalf("taken-over record = %+v, want in_progress with the new token", res.Record)
	}
	if !res.Record.LockedAt.After(res.Now.Add(-time.Second)) {
		t.Fatalf("takeover kept the old locked_at %v (now %v): the new lease would be stale at once", res.Record.LockedAt, res.Now)
	}
	// The new lease is fresh: an immediate claim does not take it over again.
	if again := mustClaim(t, b.Store, claimReq("alice", first.Key, "body")); again.Claimed {
		t.Fatal("a just-taken-over lease was taken over again")
	}
}

func testTakeoverNeedsSameFingerprint(t *testing.T, b Backend) {
	first := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, first)
	time.Sleep(Lease + 150*time.Millisecond)
	other := claimReq("alice", first.Key, "another body")
	res := mustClaim(t, b.Store, other)
	if res.Claimed {
		t.Fatal("a stale claim was taken over by a request with another fingerprint")
	}
	if !bytes.Equal(res.Record.Fingerprint, first.Fingerprint) || res.Record.LeaseToken != first.Token {
		t.Fatalf("record changed by a mismatching request: %+v", res.Record)
	}
}

func testConcurrentTakeover(t *testing.T, b Backend) {
	ctx := ctxT(t)
	const goroutines = 16
	// The racers' lease leaves a second of slack, so a straggler cannot
	// take over the winner's fresh lease on a loaded machine.
	const racerLease = time.Second
	for round := range 5 {
		first := claimReq("alice", uniq(fmt.Sprintf("takeover%d", round)), "body")
		mustClaim(t, b.Store, first)
		time.Sleep(racerLease + 100*time.Millisecond)
		var (
			wg      sync.WaitGroup
			winners atomic.Int64
			start   = make(chan struct{})
		)
		for range goroutines {
			wg.Go(func() {
				req := claimReq("alice", first.Key, "body")
				req.Lease = racerLease
				<-start
				res, err := b.Store.Claim(ctx, req)
				if err == nil && res.Claimed {
					winners.Add(1)
					if err := settleWithEffect(ctx, b, leaseOf(req), first.Key, okResponse("x")); err != nil {
						t.Errorf("winner's settle: %v", err)
					}
				} else if err != nil && !errors.Is(err, idemstore.ErrTransient) {
					t.Errorf("claim: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if w := winners.Load(); w != 1 {
			t.Fatalf("round %d: %d goroutines took over the same stale claim, want 1", round, w)
		}
		if n := effects(t, b, first.Key); n != 1 {
			t.Fatalf("round %d: %d effects, want 1", round, n)
		}
	}
}

func testStaleHolderFenced(t *testing.T, b Backend) {
	ctx := ctxT(t)
	old := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, old)
	var (
		oldCtx context.Context
		oldTx  idemstore.Tx
	)
	begin := func() {
		var err error
		if oldCtx, oldTx, err = b.Store.BeginTx(ctx, leaseOf(old)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = oldTx.Rollback(ctx) })
		if err := b.WriteEffect(oldCtx, "old-"+old.Key); err != nil {
			t.Fatal(err)
		}
	}
	// The stale holder is mid-transaction when it is taken over; on a
	// single-writer database that open write would block the takeover, so
	// there it writes right after it instead.
	if !b.SingleWriter {
		begin()
	}

	time.Sleep(Lease + 150*time.Millisecond)
	fresh := claimReq("alice", old.Key, "body")
	if res := mustClaim(t, b.Store, fresh); !res.Reclaimed {
		t.Fatalf("takeover of the expired lease failed: %+v", res)
	}
	if b.SingleWriter {
		begin()
	}

	err := oldTx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("old")})
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("stale holder's settle = %v, want ErrLeaseLost", err)
	}
	t.Run("StaleWriteRolledBack", func(t *testing.T) {
		needsSharedTx(t, b, "the stale holder's own business write stands whatever its settle says")
		if n := effects(t, b, "old-"+old.Key); n != 0 {
			t.Fatalf("stale holder's business write committed (%d rows) despite the lost lease", n)
		}
	})
	if err := b.Store.Release(ctx, leaseOf(old)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("stale holder's release = %v, want ErrLeaseLost", err)
	}
	if rec := get(t, b, "alice", old.Key); rec.State != idemstore.StateInProgress || rec.LeaseToken != fresh.Token {
		t.Fatalf("after the stale settle the record is %+v, want the new holder's", rec)
	}
	if err := settleWithEffect(ctx, b, leaseOf(fresh), "new-"+old.Key, okResponse("new")); err != nil {
		t.Fatalf("new holder's settle: %v", err)
	}
	if n := effects(t, b, "new-"+old.Key); n != 1 {
		t.Fatalf("new holder's effect count = %d, want 1", n)
	}
	rec := get(t, b, "alice", old.Key)
	if rec.State != idemstore.StateCompleted || !bytes.Equal(rec.Response.Body, okResponse("new").Body) {
		t.Fatalf("final record = %+v, want the new holder's completed response", rec)
	}
}

// testForeignEndDoesNotWait: a Release or Keep whose lease holds nothing
// answers ErrLeaseLost at once, even while another attempt's transaction
// holds the key and has written (on SQLite, holds the write lock), and
// leaves that attempt alone. The engine ends every claim whose answer it
// lost this way, a waiter's whose client went away among them: a claim that
// never committed must not wait for the handler of the one that did.
func testForeignEndDoesNotWait(t *testing.T, b Backend) {
	ctx := ctxT(t)
	req := claimReq("alice", uniq("held"), "body")
	mustClaim(t, b.Store, req)
	txCtx, tx, err := b.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := b.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	for _, end := range []struct {
		name string
		fn   func(context.Context, idemstore.Lease) error
	}{{"Release", b.Store.Release}, {"Keep", b.Store.Keep}} {
		foreign := leaseOf(req)
		foreign.Token = token()
		start := time.Now()
		err := end.fn(ctx, foreign)
		if took := time.Since(start); !errors.Is(err, idemstore.ErrLeaseLost) || took > time.Second {
			t.Fatalf("%s of a foreign lease while the holder's transaction is open = %v after %v, want ErrLeaseLost at once",
				end.name, err, took)
		}
	}
	if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("held")}); err != nil {
		t.Fatalf("the holder's settle after the foreign ends: %v", err)
	}
	if rec := get(t, b, "alice", req.Key); rec.State != idemstore.StateCompleted || rec.Uncertain {
		t.Fatalf("after the foreign ends and the settle the record is %s (uncertain %v), want completed", rec.State, rec.Uncertain)
	}
}

func testReleaseFenced(t *testing.T, b Backend) {
	ctx := ctxT(t)
	req := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, req)
	wrong := leaseOf(req)
	wrong.Token = token()
	if err := b.Store.Release(ctx, wrong); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("release with a foreign token = %v, want ErrLeaseLost", err)
	}
	if rec := get(t, b, "alice", req.Key); rec.LeaseToken != req.Token {
		t.Fatal("a foreign release touched the record")
	}
	if err := b.Store.Release(ctx, leaseOf(req)); err != nil {
		t.Fatalf("holder's release: %v", err)
	}
	// Released is a state, not a deletion: the record keeps its nonce.
	nonce := storedNonce(b, req.Nonce)
	if rec := get(t, b, "alice", req.Key); rec.State != idemstore.StateReleased || rec.Nonce != nonce || rec.Response != nil {
		t.Fatalf("after release the record is %s with nonce %q and response %v, want released with nonce %q and none",
			rec.State, rec.Nonce, rec.Response, nonce)
	}
	if err := b.Store.Release(ctx, leaseOf(req)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("second release with the released token = %v, want ErrLeaseLost", err)
	}
	if err := settle(ctx, b, leaseOf(req), idemstore.StateCompleted, okResponse("late")); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("settle with the released token = %v, want ErrLeaseLost", err)
	}
	// Released means absent: the retry claims it afresh, without waiting
	// for a lease. The same request keeps the nonce (its downstream keys
	// reach the provider again and are deduplicated); another request,
	// with another body, is another downstream operation and gets a new
	// one.
	for i, body := range []string{"body", "another body"} {
		retry := claimReq("alice", req.Key, body)
		retry.Lease = time.Hour
		res := mustClaim(t, b.Store, retry)
		if !res.Claimed || res.Reclaimed {
			t.Fatalf("claim after release with %q: Claimed=%v Reclaimed=%v, want a fresh claim", body, res.Claimed, res.Reclaimed)
		}
		want := nonce
		if i > 0 {
			want = storedNonce(b, retry.Nonce)
		}
		for _, rec := range []idem.Record{res.Record, get(t, b, "alice", req.Key)} {
			if rec.State != idemstore.StateInProgress || rec.LeaseToken != retry.Token || !bytes.Equal(rec.Fingerprint, retry.Fingerprint) ||
				rec.RequestID != retry.RequestID || rec.Nonce != want || rec.Response != nil || rec.Uncertain {
				t.Fatalf("record claimed after release with %q = %+v, want in progress for the retry with nonce %q", body, rec, want)
			}
		}
		if !res.Record.ExpiresAt.After(res.Now.Add(59*time.Minute)) || !res.Record.LeaseExpiresAt.After(res.Now.Add(59*time.Minute)) {
			t.Fatalf("record claimed after release expires at %v, lease until %v; want both about an hour after %v",
				res.Record.ExpiresAt, res.Record.LeaseExpiresAt, res.Now)
		}
		if i == 0 {
			if err := b.Store.Release(ctx, leaseOf(retry)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A released record past its expiry is gone: the next claim gets a new
	// nonce, so a new record never reuses an old one's downstream keys.
	short := claimReq("alice", uniq("k"), "body")
	short.Retention = Lease
	mustClaim(t, b.Store, short)
	if err := b.Store.Release(ctx, leaseOf(short)); err != nil {
		t.Fatalf("release: %v", err)
	}
	time.Sleep(Lease + 150*time.Millisecond)
	later := claimReq("alice", short.Key, "body")
	nonce = storedNonce(b, later.Nonce)
	if res := mustClaim(t, b.Store, later); !res.Claimed || res.Reclaimed || res.Record.Nonce != nonce {
		t.Fatalf("claim of an expired released record: Claimed=%v Reclaimed=%v nonce %q, want a fresh claim with nonce %q",
			res.Claimed, res.Reclaimed, res.Record.Nonce, nonce)
	}
	// A settled record cannot be released.
	settled := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, settled)
	if err := settleWithEffect(ctx, b, leaseOf(settled), settled.Key, okResponse("s")); err != nil {
		t.Fatal(err)
	}
	if err := b.Store.Release(ctx, leaseOf(settled)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("release of a settled record = %v, want ErrLeaseLost", err)
	}
	if rec := get(t, b, "alice", settled.Key); rec.State != idemstore.StateCompleted {
		t.Fatalf("settled record became %s after a release attempt", rec.State)
	}
}

func testExpiredRecordAbsent(t *testing.T, b Backend) {
	ctx := ctxT(t)
	req := claimReq("alice", uniq("k"), "body")
	req.Retention = Lease
	mustClaim(t, b.Store, req)
	if err := settleWithEffect(ctx, b, leaseOf(req), req.Key, okResponse("old")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(Lease + 150*time.Millisecond)
	next := claimReq("alice", req.Key, "a different body")
	res := mustClaim(t, b.Store, next)
	if !res.Claimed || res.Reclaimed {
		t.Fatalf("claim of an expired record: Claimed=%v Reclaimed=%v, want a fresh claim", res.Claimed, res.Reclaimed)
	}
	rec := res.Record
	if rec.State != idemstore.StateInProgress || rec.Response != nil || !bytes.Equal(rec.Fingerprint, next.Fingerprint) ||
		rec.LeaseToken != next.Token || rec.RequestID != next.RequestID {
		t.Fatalf("replaced record = %+v, want a fresh in-progress record for the new request", rec)
	}
	if !rec.ExpiresAt.After(res.Now.Add(59 * time.Minute)) {
		t.Fatalf("replaced record expires at %v, want about an hour after %v", rec.ExpiresAt, res.Now)
	}
	// An expired in-progress record is absent too, whatever its fingerprint.
	ip := claimReq("alice", uniq("k"), "body")
	ip.Retention, ip.Lease = Lease, time.Hour
	mustClaim(t, b.Store, ip)
	time.Sleep(Lease + 150*time.Millisecond)
	res = mustClaim(t, b.Store, claimReq("alice", ip.Key, "other"))
	if !res.Claimed {
		t.Fatal("an in-progress record past its expiry was not claimable")
	}
}

func testFailedCommit(t *testing.T, b Backend) {
	needsSharedTx(t, b, "there is no commit of the handler's writes that could fail with the settle")
	ctx := ctxT(t)
	req, txCtx, tx := claimAndBegin(t, b)
	defer func() { _ = tx.Rollback(ctx) }()
	if err := b.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	if err := b.PoisonTx(txCtx); err != nil {
		t.Fatal(err)
	}
	err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("x")})
	if err == nil {
		t.Fatal("Settle reported success for a transaction that cannot commit")
	}
	if errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("a failed commit was reported as a lost lease: %v", err)
	}
	if n := effects(t, b, req.Key); n != 0 {
		t.Fatalf("%d effects committed by a failed transaction", n)
	}
	rec := get(t, b, "alice", req.Key)
	if rec.State != idemstore.StateInProgress || rec.Response != nil {
		t.Fatalf("after a failed commit the record is %+v, want still in progress with no response", rec)
	}
	if err := b.Store.Release(ctx, leaseOf(req)); err != nil {
		t.Fatalf("release after a failed commit: %v", err)
	}
}

func testRollback(t *testing.T, b Backend) {
	ctx := ctxT(t)
	req, txCtx, tx := claimAndBegin(t, b)
	if err := b.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("second Rollback: %v", err)
	}
	t.Run("RolledBackWriteGone", func(t *testing.T) {
		needsSharedTx(t, b, "Rollback has no business write to undo")
		if n := effects(t, b, req.Key); n != 0 {
			t.Fatalf("%d effects survived a rollback", n)
		}
	})
	if rec := get(t, b, "alice", req.Key); rec.State != idemstore.StateInProgress || rec.LeaseToken != req.Token {
		t.Fatalf("after rollback the record is %+v, want the claim in progress", rec)
	}
	// The holder can still begin again and settle.
	if err := settleWithEffect(ctx, b, leaseOf(req), req.Key, okResponse("x")); err != nil {
		t.Fatalf("settle after an earlier rollback: %v", err)
	}
	// Rollback after Settle is harmless and undoes nothing.
	_, tx2, err := b.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	_ = tx2.Rollback(ctx)
	want := 1
	if b.NoSharedTx {
		want = 2 // the write before the rollback stands: nothing rolled it back
	}
	if n := effects(t, b, req.Key); n != want {
		t.Fatalf("effects = %d after settle, want %d", n, want)
	}
}

func testSettleFailed(t *testing.T, b Backend) {
	ctx := ctxT(t)
	req, _, tx := claimAndBegin(t, b)
	resp := idem.Response{Status: 400, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"bad amount"}`)}
	if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateFailed, Response: resp}); err != nil {
		t.Fatal(err)
	}
	res := mustClaim(t, b.Store, claimReq("alice", req.Key, "body"))
	if res.Claimed || res.Record.State != idemstore.StateFailed || res.Record.Response == nil || res.Record.Response.Status != 400 {
		t.Fatalf("claim after a failed outcome = %+v, want the stored 400", res)
	}
}

func testPrincipalsIsolated(t *testing.T, b Backend) {
	ctx := ctxT(t)
	key := uniq("shared")
	alice := claimReq("alice", key, "body")
	bob := claimReq("bob", key, "body")
	if res := mustClaim(t, b.Store, alice); !res.Claimed {
		t.Fatal("alice could not claim")
	}
	if res := mustClaim(t, b.Store, bob); !res.Claimed {
		t.Fatal("bob could not claim the key alice holds: keys crossed principals")
	}
	if err := settleWithEffect(ctx, b, leaseOf(alice), "alice-"+key, okResponse("alice")); err != nil {
		t.Fatal(err)
	}
	if rec := get(t, b, "bob", key); rec.State != idemstore.StateInProgress || rec.LeaseToken != bob.Token {
		t.Fatalf("bob's record = %+v after alice settled", rec)
	}
	// A lease is per principal: alice's token cannot release bob's claim.
	cross := idemstore.Lease{Principal: "bob", Key: key, Token: alice.Token}
	if err := b.Store.Release(ctx, cross); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("release of bob's claim with alice's token = %v, want ErrLeaseLost", err)
	}
	if _, err := b.Store.Get(ctx, "carol", key); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("carol sees a record for a key only alice and bob used: %v", err)
	}
}

func testGetMissing(t *testing.T, b Backend) {
	if _, err := b.Store.Get(ctxT(t), "alice", uniq("never")); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("Get of a missing key = %v, want ErrNotFound", err)
	}
}

func testPurgeExpired(t *testing.T, b Backend) {
	ctx := ctxT(t)
	var expired, live []string
	// Expired records in every state: abandoned claims, completed, failed
	// and released ones (a store may find them through different indexes).
	for i := range 7 {
		req := claimReq("alice", uniq(fmt.Sprintf("exp%d", i)), "body")
		req.Retention = Lease
		mustClaim(t, b.Store, req)
		expired = append(expired, req.Key)
		switch i % 4 {
		case 1:
			if err := settleWithEffect(ctx, b, leaseOf(req), req.Key, okResponse("old")); err != nil {
				t.Fatal(err)
			}
		case 2:
			if err := settleFailed(ctx, b, leaseOf(req)); err != nil {
				t.Fatal(err)
			}
		case 3:
			if err := b.Store.Release(ctx, leaseOf(req)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 3 {
		req := claimReq("alice", uniq(fmt.Sprintf("live%d", i)), "body")
		mustClaim(t, b.Store, req)
		live = append(live, req.Key)
	}
	time.Sleep(Lease + 150*time.Millisecond)
	total := 0
	for pass := 0; ; pass++ {
		n, err := b.Store.PurgeExpired(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		if n > 3 {
			t.Fatalf("PurgeExpired(limit 3) deleted %d", n)
		}
		total += n
		if n == 0 || pass > 10 {
			break
		}
	}
	want := len(expired)
	if b.SelfExpiring {
		want = 0 // the store expired them itself
	}
	if total != want {
		t.Fatalf("purged %d records, want %d", total, want)
	}
	for _, k := range expired {
		if _, err := b.Store.Get(ctx, "alice", k); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("expired %s survived the purge: %v", k, err)
		}
	}
	for _, k := range live {
		get(t, b, "alice", k)
	}
}

func testConcurrentPurge(t *testing.T, b Backend) {
	ctx := ctxT(t)
	const n = 40
	var keys []string
	for i := range n {
		req := claimReq("alice", uniq(fmt.Sprintf("exp%d", i)), "body")
		req.Retention = Lease
		mustClaim(t, b.Store, req)
		keys = append(keys, req.Key)
	}
	time.Sleep(Lease + 150*time.Millisecond)
	var (
		wg    sync.WaitGroup
		total atomic.Int64
	)
	for range 3 {
		wg.Go(func() {
			for {
				got, err := b.Store.PurgeExpired(ctx, 5)
				if err != nil && !errors.Is(err, idemstore.ErrTransient) {
					t.Errorf("PurgeExpired: %v", err)
					return
				}
				total.Add(int64(got))
				if err == nil && got == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	want := int64(n)
	if b.SelfExpiring {
		want = 0 // the store expired them itself
	}
	if got := total.Load(); got != want {
		t.Fatalf("three purgers together report %d deletions of %d expired records, want %d", got, n, want)
	}
	for _, k := range keys {
		if _, err := b.Store.Get(ctx, "alice", k); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("expired %s survived the purgers: %v", k, err)
		}
	}
}

func testListStale(t *testing.T, b Backend) {
	ctx := ctxT(t)
	principal := uniq("stale-owner")
	older := claimReq(principal, uniq("a"), "body")
	mustClaim(t, b.Store, older)
	time.Sleep(20 * time.Millisecond)
	newer := claimReq(principal, uniq("b"), "body")
	mustClaim(t, b.Store, newer)
	settled := claimReq(principal, uniq("c"), "body")
	mustClaim(t, b.Store, settled)
	if err := settleWithEffect(ctx, b, leaseOf(settled), settled.Key, okResponse("c")); err != nil {
		t.Fatal(err)
	}
	released := claimReq(principal, uniq("e"), "body")
	mustClaim(t, b.Store, released)
	if err := b.Store.Release(ctx, leaseOf(released)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(Lease + 150*time.Millisecond)
	fresh := claimReq(principal, uniq("d"), "body")
	mustClaim(t, b.Store, fresh)
	claimedFresh := time.Now()

	stale, err := b.Store.ListStale(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	// On a loaded machine the fresh claim may itself have aged past the
	// lease by the time ListStale ran; only then may it be listed.
	freshMayBeStale := time.Since(claimedFresh) >= Lease/2
	var mine []idem.Record
	for _, r := range stale {
		if r.Principal == principal && !(freshMayBeStale && r.Key == fresh.Key) {
			mine = append(mine, r)
		}
		if r.State != idemstore.StateInProgress {
			t.Fatalf("ListStale returned a %s record", r.State)
		}
	}
	if len(mine) != 2 || mine[0].Key != older.Key || mine[1].Key != newer.Key {
		t.Fatalf("ListStale = %+v, want [%s %s] oldest first", mine, older.Key, newer.Key)
	}
	if one, err := b.Store.ListStale(ctx, 1); err != nil || len(one) != 1 {
		t.Fatalf("ListStale(limit 1) = %d records, %v", len(one), err)
	}
}

// testResponseRoundTrip settles responses of every shape and reads each
// back through Get, a Claim that finds the record and Get again, byte for
// byte: header values with NUL bytes, invalid UTF-8 or nothing in them,
// several values under one name, a header without values, long names and
// values, many headers, a binary body of half a megabyte, an empty one.
// The store keeps its own copy of what Settle is given, and every read
// belongs to its caller: changing one, as a caller may, changes nothing
// the next read sees.
func testResponseRoundTrip(t *testing.T, b Backend) {
	ctx := ctxT(t)
	big := make([]byte, 512<<10)
	_, _ = rand.Read(big)
	big[0], big[1], big[len(big)-1] = 0, 0xff, 0
	long := strings.Repeat("väl", 200)
	many := http.Header{}
	for i := range 40 {
		many[fmt.Sprintf("X-H%d", i)] = []string{strconv.Itoa(i)}
	}
	shapes := map[string]idem.Response{
		"binary": {Status: http.StatusAccepted, Header: http.Header{
			"Content-Type":     {"application/octet-stream"},
			"Location":         {"/payments/ä/\"quoted\""},
			"Cache-Control":    {"no-store", "private"},
			"Content-Language": {"de-CH"},
			"X-Empty":          {""},
		}, Body: big},
		"byte-exact headers": {Status: 201, Header: http.Header{"X-Nul": {"a\x00b"}, "X-Bin": {"\xff\xfe", ""},
			"Content-Type": {`text/plain; charset="\u00e9"`}, "X-\xffName": {"v"}}, Body: []byte("b")},
		"several values": {Status: 201, Header: http.Header{"Set-Cookie": {"a=1", "b=2", "c=3"}, "X-Also": {"", "x", ""}},
			Body: []byte(`{"id":"1"}`)},
		"header without values": {Status: 200, Header: http.Header{"X-None": {}, "X-One": {"1"}}, Body: []byte("ok")},
		"long fields":           {Status: 299, Header: http.Header{"X-" + long: {long, long}}, Body: []byte(long)},
		"many headers":          {Status: 400, Header: many, Body: []byte(`{"title":"bad"}`)},
		"empty":                 {Status: 204},
	}
	for name, resp := range shapes {
		req := claimReq("alice", uniq("k"), "body")
		mustClaim(t, b.Store, req)
		_, tx, err := b.Store.BeginTx(ctx, leaseOf(req))
		if err != nil {
			t.Fatal(err)
		}
		sent := idem.Response{Status: resp.Status, Header: resp.Header.Clone(), Body: bytes.Clone(resp.Body)}
		if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: sent}); err != nil {
			t.Fatalf("%s: settle: %v", name, err)
		}
		// Adapters reuse their header map and body buffer once Settle
		// returns: the store must keep its own copy.
		for _, v := range sent.Header {
			if len(v) > 0 {
				v[0] = "scribbled"
			}
		}
		if sent.Header != nil {
			sent.Header["X-Late"] = []string{"late"}
		}
		clear(sent.Body)
		reads := []func() idem.Record{
			func() idem.Record { return get(t, b, "alice", req.Key) },
			func() idem.Record { return mustClaim(t, b.Store, claimReq("alice", req.Key, "body")).Record },
			func() idem.Record { return get(t, b, "alice", req.Key) },
		}
		for _, read := range reads {
			rec := read()
			got := rec.Response
			if got == nil || got.Status != resp.Status || !bytes.Equal(got.Body, resp.Body) {
				t.Fatalf("%s: stored response differs: status %v, body equal %v", name, got != nil && got.Status == resp.Status, got != nil && bytes.Equal(got.Body, resp.Body))
			}
			if len(got.Header) != len(resp.Header) {
				t.Fatalf("%s: stored header = %q, want %q", name, got.Header, resp.Header)
			}
			for k, v := range resp.Header {
				if g, ok := got.Header[k]; !ok || !slices.Equal(g, v) {
					t.Fatalf("%s: header %q = %q, want %q", name, k, got.Header[k], v)
				}
			}
			if rec.RequestID != req.RequestID || !bytes.Equal(rec.Fingerprint, req.Fingerprint) {
				t.Fatalf("%s: request id or fingerprint not kept: %+v", name, rec)
			}
			scribble(t, rec)
		}
	}
}

// scribble changes rec in every way a caller may: values appended to one
// header must leave the others alone, bytes appended to the fingerprint
// must leave the body alone.
func scribble(t *testing.T, rec idem.Record) {
	t.Helper()
	h := rec.Response.Header
	for name := range h {
		before := h.Clone()
		h[name] = append(h[name], "appended")
		for other, vs := range before {
			if other != name && !slices.Equal(h[other], vs) {
				t.Fatalf("appending to header %q changed %q to %q", name, other, h[other])
			}
		}
		h[name][0] = "changed"
	}
	if h != nil {
		h["X-Caller"] = []string{"x"}
	}
	body := bytes.Clone(rec.Response.Body)
	rec.Fingerprint = append(rec.Fingerprint, 1, 2, 3)
	if !bytes.Equal(rec.Response.Body, body) {
		t.Fatal("appending to the fingerprint changed the body")
	}
	for i := range rec.Fingerprint {
		rec.Fingerprint[i] ^= 0xff
	}
	for i := range rec.Response.Body {
		rec.Response.Body[i] ^= 0xff
	}
}

// testSweepersUnderTraffic runs two sweepers while live requests claim and
// settle other keys: the expired rows are purged once in all, the live rows
// are untouched, and nobody sees an error (a deadlock would surface as one).
func testSweepersUnderTraffic(t *testing.T, b Backend) {
	ctx := ctxT(t)
	const expired = 60
	var expiredKeys []string
	for i := range expired {
		req := claimReq("sweep", uniq(fmt.Sprintf("exp%d", i)), "body")
		req.Retention = Lease
		mustClaim(t, b.Store, req)
		expiredKeys = append(expiredKeys, req.Key)
	}
	time.Sleep(Lease + 150*time.Millisecond)

	stop := make(chan struct{})
	var (
		wg     sync.WaitGroup
		purged atomic.Int64
		live   sync.Map
	)
	for range 2 {
		wg.Go(func() {
			s := idem.Sweeper{Store: b.Store, BatchSize: 7}
			for {
				res, err := s.Sweep(ctx)
				purged.Add(int64(res.Purged))
				if err != nil {
					t.Errorf("sweep: %v", err)
					return
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				req := claimReq("sweep", uniq(fmt.Sprintf("live%d-%d", w, i)), "body")
				req.Lease = time.Minute
				res, err := b.Store.Claim(ctx, req)
				if errors.Is(err, idemstore.ErrTransient) {
					continue
				}
				if err != nil || !res.Claimed {
					t.Errorf("live claim: %+v, %v", res, err)
					return
				}
				if err := settleWithEffect(ctx, b, leaseOf(req), req.Key, okResponse("live")); err != nil {
					t.Errorf("live settle: %v", err)
					return
				}
				live.Store(req.Key, true)
			}
		})
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	want := int64(expired)
	if b.SelfExpiring {
		want = 0 // the store expired them itself
	}
	if got := purged.Load(); got != want {
		t.Fatalf("two sweepers purged %d rows in all, want %d (%d expired, SelfExpiring %v)", got, want, expired, b.SelfExpiring)
	}
	for _, k := range expiredKeys {
		if _, err := b.Store.Get(ctx, "sweep", k); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("expired %s survived the sweep: %v", k, err)
		}
	}
	n := 0
	live.Range(func(k, _ any) bool {
		n++
		if rec := get(t, b, "sweep", k.(string)); rec.State != idemstore.StateCompleted {
			t.Fatalf("live record %s is %s after the sweep", k, rec.State)
		}
		return true
	})
	t.Logf("2 sweepers purged %d of %d expired rows (SelfExpiring %v) while %d live requests settled", purged.Load(), expired, b.SelfExpiring, n)
}

// Free reports whether the next claim of principal's key in s runs afresh:
// s holds no record for it, or a released one (idemstore.StateReleased, which
// keeps only the nonce). It returns the record it found, if any, for the
// caller's message, and fails t when Get fails otherwise. Tests that check
// that a key was given back use it instead of expecting idemstore.ErrNotFound.
func Free(t testing.TB, s idemstore.Store, principal, key string) (idem.Record, bool) {
	t.Helper()
	rec, err := s.Get(ctxT(t), principal, key)
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return rec, true
	case err != nil:
		t.Fatalf("Get(%s/%s): %v", principal, key, err)
	}
	return rec, rec.State == idemstore.StateReleased
}

// Held counts the records in s that hold their key: in progress, completed
// or failed, not released (see Free). It reads Store.Stats and fails t when
// that fails or a figure is not counted.
func Held(t testing.TB, s idemstore.Store) int {
	t.Helper()
	st, err := s.Stats(ctxT(t), time.Hour)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if !st.InProgress.Counted() || !st.Completed.Counted() || !st.Failed.Counted() {
		t.Fatalf("Stats counts %v in progress, %v completed, %v failed: Held needs every figure", st.InProgress, st.Completed, st.Failed)
	}
	return int(st.InProgress + st.Completed + st.Failed)
}
