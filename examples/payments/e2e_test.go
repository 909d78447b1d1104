package main

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
)

// contractDelay is the -handler-delay of the contract runs: long enough
// that ten concurrent retries overlap the first attempt.
const contractDelay = 750 * time.Millisecond

// TestContract runs the example service contract of docs/design.md against
// every framework × store combination, each on its own process and
// database.
func TestContract(t *testing.T) {
	for _, store := range storeNames {
		for _, fw := range frameworkNames {
			t.Run(fw+"/"+store, func(t *testing.T) {
				t.Parallel()
				args, _ := storeArgs(t, store)
				p := startService(t, append(args, "-framework", fw,
					"-handler-delay", contractDelay.String(), "-simulate-failures")...)
				runContract(t, p.base, store)
			})
		}
	}
}

const payBody = `{"amount": 1250, "currency": "EUR", "description": "order 42"}`

func runContract(t *testing.T, base, store string) {
	// SQLite has one writer, and each claimed request holds it for the
	// handler delay: run its cases one after another so that no claim
	// queues past the busy timeout. The other stores run them at once.
	parallel := func(t *testing.T) {
		if store != "sqlite" {
			t.Parallel()
		}
	}
	t.Run("cases", func(t *testing.T) {
		t.Run("replay", func(t *testing.T) { parallel(t); testReplay(t, base) })
		t.Run("fingerprint_mismatch", func(t *testing.T) { parallel(t); testMismatch(t, base) })
		t.Run("invalid_body", func(t *testing.T) { parallel(t); testInvalidBody(t, base) })
		t.Run("auth", func(t *testing.T) { parallel(t); testAuth(t, base) })
		t.Run("principal_isolation", func(t *testing.T) { parallel(t); testIsolation(t, base) })
		t.Run("order_and_count", func(t *testing.T) { parallel(t); testOrder(t, base) })
		t.Run("concurrent_retries", func(t *testing.T) { parallel(t); testConcurrent(t, base, store) })
		t.Run("drill_transient", func(t *testing.T) { parallel(t); testDrill(t, base, "transient", http.StatusServiceUnavailable) })
		t.Run("drill_panic", func(t *testing.T) { parallel(t); testDrill(t, base, "panic", http.StatusInternalServerError) })
	})
	t.Run("metrics", func(t *testing.T) { testMetrics(t, base) })
}

func account(testing.TB) string { return "acct_" + randHex(4) }

func wantPayments(t *testing.T, base, acct string, n int) []paymentJSON {
	t.Helper()
	ps := listPayments(t, base, acct)
	if len(ps) != n {
		t.Fatalf("%s has %d payments, want %d: %+v", acct, len(ps), n, ps)
	}
	return ps
}

func testReplay(t *testing.T, base string) {
	acct, key := account(t), "replay-"+randHex(4)
	first := do(t, "POST", base+"/payments", acct, key, payBody)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first POST: %v (replayed %v), want a fresh 201", first, first.replayed())
	}
	p := decodePayment(t, first)
	if !strings.HasPrefix(p.ID, "pay_") || p.Amount != 1250 || p.Currency != "EUR" || p.Description != "order 42" ||
		p.Status != "succeeded" || p.CreatedAt == "" {
		t.Fatalf("payment %+v", p)
	}
	if _, err := time.Parse(time.RFC3339Nano, p.CreatedAt); err != nil {
		t.Fatalf("created_at %q: %v", p.CreatedAt, err)
	}
	if loc := first.header.Get("Location"); loc != "/payments/"+p.ID {
		t.Fatalf("Location %q, want /payments/%s", loc, p.ID)
	}
	if ct := first.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	// The retry, in the structured-field string form too, is the same key.
	for _, k := range []string{key, `"` + key + `"`} {
		again := do(t, "POST", base+"/payments", acct, k, `{"currency":"EUR","amount":1250,  "description":"order 42"}`)
		if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, first.body) ||
			again.header.Get("Location") != first.header.Get("Location") {
			t.Fatalf("retry with key %s: %v replayed=%v Location=%q, want the first response replayed",
				k, again, again.replayed(), again.header.Get("Location"))
		}
	}
	got := do(t, "GET", base+"/payments/"+p.ID, acct, "", "")
	if got.status != http.StatusOK || decodePayment(t, got) != p {
		t.Fatalf("GET /payments/%s: %v, want %+v", p.ID, got, p)
	}
	if ps := wantPayments(t, base, acct, 1); ps[0] != p {
		t.Fatalf("listed %+v, want %+v", ps[0], p)
	}
	if r := do(t, "GET", base+"/payments/pay_doesnotexist", acct, "", ""); r.status != http.StatusNotFound || r.problemType() == "" {
		t.Fatalf("GET unknown payment: %v, want a 404 problem", r)
	}
}

func testMismatch(t *testing.T, base string) {
	acct, key := account(t), "mismatch-"+randHex(4)
	if r := do(t, "POST", base+"/payments", acct, key, payBody); r.status != http.StatusCreated {
		t.Fatalf("first POST: %v", r)
	}
	r := do(t, "POST", base+"/payments", acct, key, `{"amount": 9999, "currency": "EUR"}`)
	if r.status != http.StatusUnprocessableEntity || !strings.HasSuffix(r.problemType(), "#key-reused") {
		t.Fatalf("changed body: %v, want a 422 key-reused problem", r)
	}
	wantPayments(t, base, acct, 1)
}

func testInvalidBody(t *testing.T, base string) {
	acct := account(t)
	bad := []string{
		`{"amount": 0, "currency": "EUR"}`,
		`{"amount": -5, "currency": "EUR"}`,
		`{"amount": 1.5, "currency": "EUR"}`,
		`{"amount": "100", "currency": "EUR"}`,
		`{"currency": "EUR"}`,
		`{"amount": 100, "currency": "eur"}`,
		`{"amount": 100, "currency": "EURO"}`,
		`{"amount": 100}`,
		`{"amount": 100, "currency": "EUR", "description": 7}`,
		`{"amount": 100, "currency": "EUR", "tip": 1}`,
		`{"amount": 100, "currency": "EUR"} {}`,
		`not json`,
		`[]`,
	}
	for i, body := range bad {
		key := fmt.Sprintf("bad-%d-%s", i, randHex(3))
		first := do(t, "POST", base+"/payments", acct, key, body)
		if first.status != http.StatusBadRequest || !strings.HasSuffix(first.problemType(), "#invalid-payment") || first.replayed() {
			t.Fatalf("body %s: %v, want a fresh 400 invalid-payment problem", body, first)
		}
		// Stored as failed: the retry replays the same 400.
		again := do(t, "POST", base+"/payments", acct, key, body)
		if again.status != http.StatusBadRequest || !again.replayed() || !bytes.Equal(again.body, first.body) {
			t.Fatalf("retry of body %s: %v replayed=%v, want the stored 400 replayed", body, again, again.replayed())
		}
	}
	if r := do(t, "POST", base+"/payments", acct, "", payBody); r.status != http.StatusBadRequest ||
		!strings.HasSuffix(r.problemType(), "#key-missing") {
		t.Fatalf("POST without a key: %v, want a 400 key-missing problem", r)
	}
	wantPayments(t, base, acct, 0)
}

func testAuth(t *testing.T, base string) {
	key := "auth-" + randHex(4)
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer Alice", "Basic YWxpY2U6", "Bearer a b",
		"Bearer " + strings.Repeat("a", 65), "Bearer al.ice", "Token alice"} {
		for _, rq := range []struct{ method, path, body string }{
			{"POST", "/payments", payBody}, {"GET", "/payments", ""}, {"GET", "/payments/pay_x", ""},
		} {
			h := []string{}
			if auth != "" {
				h = []string{"Authorization", auth}
			}
			r := do(t, rq.method, base+rq.path, "", key, rq.body, h...)
			if r.status != http.StatusUnauthorized || !strings.HasSuffix(r.problemType(), "#unauthenticated") {
				t.Fatalf("%s %s with Authorization %q: %v, want a 401 problem", rq.method, rq.path, auth, r)
			}
		}
	}
	// Nothing was claimed: the key is free for an authenticated request.
	acct := account(t)
	if r := do(t, "POST", base+"/payments", acct, key, payBody); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("authenticated POST after the 401s: %v", r)
	}
	if r := do(t, "GET", base+"/payments", strings.Repeat("z", 64), "", ""); r.status != http.StatusOK {
		t.Fatalf("a 64-character account: %v", r)
	}
}

func testIsolation(t *testing.T, base string) {
	alice, bob, key := account(t), account(t), "shared-"+randHex(4)
	ra := do(t, "POST", base+"/payments", alice, key, payBody)
	rb := do(t, "POST", base+"/payments", bob, key, payBody)
	if ra.status != http.StatusCreated || rb.status != http.StatusCreated || ra.replayed() || rb.replayed() {
		t.Fatalf("same key, two accounts: %v / %v, want two fresh 201s", ra, rb)
	}
	pa, pb := decodePayment(t, ra), decodePayment(t, rb)
	if pa.ID == pb.ID {
		t.Fatal("two accounts got the same payment")
	}
	if r := do(t, "GET", base+"/payments/"+pa.ID, bob, "", ""); r.status != http.StatusNotFound ||
		bytes.Contains(r.body, []byte(pa.ID)) {
		t.Fatalf("bob reading alice's payment: %v, want 404", r)
	}
	if ps := wantPayments(t, base, bob, 1); ps[0].ID != pb.ID {
		t.Fatalf("bob's list %+v", ps)
	}
	if ps := wantPayments(t, base, alice, 1); ps[0].ID != pa.ID {
		t.Fatalf("alice's list %+v", ps)
	}
}

func testOrder(t *testing.T, base string) {
	acct := account(t)
	var ids []string
	for i := 1; i <= 3; i++ {
		r := do(t, "POST", base+"/payments", acct, "order-"+randHex(4), fmt.Sprintf(`{"amount": %d, "currency": "USD"}`, i))
		if r.status != http.StatusCreated {
			t.Fatalf("POST %d: %v", i, r)
		}
		ids = append(ids, decodePayment(t, r).ID)
	}
	ps := wantPayments(t, base, acct, 3)
	for i, p := range ps {
		if p.ID != ids[i] || p.Amount != int64(i+1) {
			t.Fatalf("payments not oldest first: got %+v, want ids %v", ps, ids)
		}
	}
}

// testConcurrent sends ten identical requests at once while the handler
// sleeps: exactly one runs; the others get 409 (or, once it committed, the
// replay). On SQLite the claim of a new key waits for the single writer,
// so there a request that arrives late may see the replay instead.
func testConcurrent(t *testing.T, base, store string) {
	acct, key := account(t), "conc-"+randHex(4)
	const n = 10
	replies := make([]reply, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			replies[i], errs[i] = tryDo("POST", base+"/payments", acct, key, payBody)
		})
	}
	close(gate)
	wg.Wait()
	var fresh, conflicts, replays int
	var created reply
	for i, r := range replies {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		switch {
		case r.status == http.StatusCreated && !r.replayed():
			fresh++
			created = r
		case r.status == http.StatusCreated:
			replays++
		case r.status == http.StatusConflict:
			if !strings.HasSuffix(r.problemType(), "#key-in-use") || r.header.Get("Retry-After") == "" {
				t.Fatalf("409 without the key-in-use problem or Retry-After: %v %v", r, r.header)
			}
			conflicts++
		default:
			t.Fatalf("unexpected reply %v", r)
		}
	}
	t.Logf("%d concurrent retries: %d fresh 201, %d 409, %d replayed", n, fresh, conflicts, replays)
	if fresh != 1 {
		t.Fatalf("%d fresh 201s, want exactly 1", fresh)
	}
	if store != "sqlite" && conflicts == 0 {
		t.Fatalf("no 409 while the first attempt slept %v", contractDelay)
	}
	for i, r := range replies {
		if r.status == http.StatusCreated && !bytes.Equal(r.body, created.body) {
			t.Fatalf("reply %d differs from the original: %s vs %s", i, r.body, created.body)
		}
	}
	after := do(t, "POST", base+"/payments", acct, key, payBody)
	if after.status != http.StatusCreated || !after.replayed() || !bytes.Equal(after.body, created.body) {
		t.Fatalf("retry after the run: %v", after)
	}
	wantPayments(t, base, acct, 1)
}

// testDrill: a failure after the payment row was written leaves neither
// the payment nor a stored response; the retry without the drill really
// runs (a fresh 201) and the account has exactly one payment.
func testDrill(t *testing.T, base, drill string, wantStatus int) {
	acct, key := account(t), "drill-"+drill+"-"+randHex(4)
	r := do(t, "POST", base+"/payments", acct, key, payBody, SimulateHeader, drill)
	if r.status != wantStatus || r.replayed() || r.problemType() == "" {
		t.Fatalf("%s drill: %v, want a %d problem", drill, r, wantStatus)
	}
	wantPayments(t, base, acct, 0)
	// Not stored: the same drill runs again (it would replay if stored).
	if r2 := do(t, "POST", base+"/payments", acct, key, payBody, SimulateHeader, drill); r2.status != wantStatus || r2.replayed() {
		t.Fatalf("%s drill again: %v replayed=%v", drill, r2, r2.replayed())
	}
	wantPayments(t, base, acct, 0)
	ok := do(t, "POST", base+"/payments", acct, key, payBody)
	if ok.status != http.StatusCreated || ok.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry without the drill: %v Idempotent-Replayed=%q, want a fresh 201", ok, ok.header.Get("Idempotent-Replayed"))
	}
	again := do(t, "POST", base+"/payments", acct, key, payBody, SimulateHeader, drill)
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, ok.body) {
		t.Fatalf("retry after the success (drill header ignored for a replay): %v", again)
	}
	wantPayments(t, base, acct, 1)
}

func testMetrics(t *testing.T, base string) {
	r := do(t, "GET", base+"/metrics", "", "", "")
	if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %d %s", r.status, r.header.Get("Content-Type"))
	}
	text := string(r.body)
	// Every outcome is exported from the start, at zero, on the
	// pre-registered route; the ones this run caused were counted.
	for _, o := range idem.Outcomes {
		if !strings.Contains(text, `idem_requests_total{outcome="`+string(o)+`",route="/payments"}`) {
			t.Errorf("/metrics lacks the %s series of route /payments", o)
		}
	}
	for outcome, want := range map[string]bool{"claimed": true, "released": true, "replayed": true,
		"fingerprint_mismatch": true, "stale_reclaimed": false} {
		if n, _ := outcomeCount(t, text, outcome); (n > 0) != want {
			t.Errorf("idem_requests_total{outcome=%q} = %v, want it counted: %v\n%s", outcome, n, want, grepLines(text, "idem_requests_total"))
		}
	}
	for _, want := range []string{`idem_claim_duration_seconds_bucket{le="+Inf"}`,
		// The stale claims are the store's, which other tests' crashes
		// share on redis: present, whatever their number.
		"\nidem_stale_claims ", "\nidem_sweep_last_success_timestamp_seconds "} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestDrillsNeedTheFlag: without -simulate-failures the drill header is
// ignored.
func TestDrillsNeedTheFlag(t *testing.T) {
	t.Parallel()
	p := startService(t, "-store", "memory")
	acct := account(t)
	for _, drill := range []string{"transient", "panic"} {
		r := do(t, "POST", p.base+"/payments", acct, "noflag-"+drill, payBody, SimulateHeader, drill)
		if r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("%s header without the flag: %v, want 201", drill, r)
		}
	}
	wantPayments(t, p.base, acct, 2)
	if !strings.Contains(p.logs.String(), "framework=gin store=memory") {
		t.Errorf("start-up line does not name the defaults: %s", p.logs)
	}
}

// TestWaitInFlight: with -wait-in-flight, duplicates sent while the first
// request runs wait for it and get its 201 replayed instead of 409.
func TestWaitInFlight(t *testing.T) {
	t.Parallel()
	p := startService(t, "-store", "memory", "-wait-in-flight", "2s", "-handler-delay", "300ms")
	acct, key := account(t), "wait-"+randHex(4)
	const n = 6
	replies := make([]reply, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i], errs[i] = tryDo("POST", p.base+"/payments", acct, key, payBody) })
	}
	wg.Wait()
	var fresh, replays int
	var created reply
	for i, r := range replies {
		switch {
		case errs[i] != nil:
			t.Fatalf("request %d: %v", i, errs[i])
		case r.status == http.StatusCreated && !r.replayed():
			fresh++
			created = r
		case r.status == http.StatusCreated:
			replays++
		default:
			t.Fatalf("request %d got %v, want a 201 (fresh or replayed)", i, r)
		}
	}
	if fresh != 1 || replays != n-1 {
		t.Fatalf("%d fresh 201s and %d replays, want 1 and %d", fresh, replays, n-1)
	}
	for i, r := range replies {
		if !bytes.Equal(r.body, created.body) {
			t.Fatalf("reply %d differs from the original: %s vs %s", i, r.body, created.body)
		}
	}
	if !p.logs.await("wait=replayed", 5*time.Second) {
		t.Errorf("no log line says a duplicate waited: %s", p.logs)
	}
	wantPayments(t, p.base, acct, 1)
}
