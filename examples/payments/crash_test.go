package main

import (
	"net/http"
	"testing"
	"time"
)

// Crash-test timing: the handler sleeps crashDelay with the payment row
// written and uncommitted; the lease must exceed request timeout + store
// timeout, so it is as short as the engine allows with these values.
const (
	crashDelay   = 2 * time.Second
	crashTimeout = 3 * time.Second
	crashStoreTO = 1 * time.Second
	crashLease   = 5 * time.Second
	// crashSlack covers the retry interval, the restart and a slow
	// -race process.
	crashSlack = 1500 * time.Millisecond
)

// TestCrashRecovery SIGKILLs the service while a payment sits written but
// uncommitted, restarts it on the same database and retries until 201:
// exactly one payment, and the key was blocked no longer than the lease.
//
// On redis the killed attempt's payment row is committed already (no
// shared transaction): the test sees it before the retry, and the takeover
// must answer with that payment (Reconcile finds it by its downstream key)
// instead of writing a second one.
func TestCrashRecovery(t *testing.T) {
	for _, store := range []string{"sqlite", "pgx", "gorm-postgres", "gorm-mysql", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			testCrash(t, store)
		})
	}
}

func testCrash(t *testing.T, store string) {
	args, _ := storeArgs(t, store)
	args = append(args, "-handler-delay", crashDelay.String(),
		"-request-timeout", crashTimeout.String(), "-store-timeout", crashStoreTO.String(), "-lease", crashLease.String())
	first := startService(t, args...)
	acct, key := account(nil), "crash-"+randHex(4)

	sent := time.Now()
	go func() { _, _ = tryDo("POST", first.base+"/payments", acct, key, payBody) }()
	// Half way through the handler's sleep the row is written and the
	// claim is in_progress; kill the process without a chance to clean up.
	time.Sleep(crashDelay / 2)
	first.kill()
	killed := time.Since(sent)

	second := startService(t, args...)
	restarted := time.Since(sent)
	// What the crash left: on a store with a shared transaction nothing;
	// on redis the payment row, committed before the record was settled.
	left := listPayments(t, second.base, acct)
	if want := map[bool]int{true: 1, false: 0}[store == "redis"]; len(left) != want {
		t.Fatalf("after the crash %s has %d payments, want %d: %+v", acct, len(left), want, left)
	}
	var (
		conflicts int
		lastBusy  time.Duration
		ok        reply
		okSent    time.Duration
	)
	for deadline := time.Now().Add(3 * crashLease); ; {
		if time.Now().After(deadline) {
			t.Fatalf("no 201 within %v of the restart (%d 409s)", 3*crashLease, conflicts)
		}
		at := time.Since(sent)
		r := do(t, "POST", second.base+"/payments", acct, key, payBody)
		if r.status == http.StatusConflict {
			conflicts++
			lastBusy = at
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if r.status != http.StatusCreated {
			t.Fatalf("retry after the crash: %v", r)
		}
		ok, okSent = r, at
		break
	}
	if conflicts == 0 {
		t.Fatal("the first retry after the restart was not refused: the crashed attempt left no claim")
	}
	if ok.replayed() {
		t.Fatalf("the retry got a replay, but the crashed attempt never committed: %v", ok)
	}
	// The key was blocked from the original request until the retry that
	// went through was sent.
	blocked := okSent
	t.Logf("%s: killed at %v, restarted at %v, %d retries refused (last sent at %v), key blocked %v (lease %v)",
		store, killed.Round(time.Millisecond), restarted.Round(time.Millisecond), conflicts,
		lastBusy.Round(time.Millisecond), blocked.Round(time.Millisecond), crashLease)
	if blocked > crashLease+crashSlack {
		t.Errorf("key blocked %v, more than the lease %v (+%v)", blocked, crashLease, crashSlack)
	}
	if lastBusy > crashLease+crashSlack {
		t.Errorf("a retry sent %v after the original was still refused (lease %v)", lastBusy, crashLease)
	}
	if blocked < crashLease-crashSlack {
		t.Errorf("key taken over after %v, before the lease %v ran out", blocked, crashLease)
	}
	ps := wantPayments(t, second.base, acct, 1)
	if p := decodePayment(t, ok); ps[0] != p {
		t.Fatalf("listed %+v, want %+v", ps[0], p)
	}
	if len(left) == 1 && left[0] != ps[0] {
		t.Fatalf("the retry answered %+v, not the payment the crashed attempt wrote %+v", ps[0], left[0])
	}
	// With -store redis the takeover runs the handler again (there is no
	// Reconcile: it would get the record, not the request): its insert
	// finds the crashed attempt's payment by the downstream key, compares
	// it with the request and answers it, as checked above: one payment,
	// the crashed attempt's.
	if r := do(t, "POST", second.base+"/payments", acct, key, payBody); r.status != http.StatusCreated || !r.replayed() {
		t.Fatalf("retry after recovery: %v, want the replay", r)
	}
	m := do(t, "GET", second.base+"/metrics", "", "", "")
	if n, _ := outcomeCount(t, string(m.body), "stale_reclaimed"); n != 1 {
		t.Errorf("the takeover was not counted as stale_reclaimed:\n%s", grepLines(string(m.body), "idem_requests_total"))
	}
}
