package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestFakeProvider is the provider's contract (README, "The fake payment
// provider"): one charge per idempotency key, the same charge answered to
// every later call with that key, 422 for the key with another charge.
func TestFakeProvider(t *testing.T) {
	srv := httptest.NewServer(newFakeProvider().handler())
	defer srv.Close()
	const body = `{"account":"acct_1","amount":1250,"currency":"EUR","description":"order 42"}`
	for _, tc := range []struct {
		name, key, body string
		status          int
		replayed        bool
	}{
		{"first", "k1", body, http.StatusCreated, false},
		{"same key", "k1", body, http.StatusOK, true},
		{"same key, another amount", "k1", strings.Replace(body, "1250", "1300", 1), http.StatusUnprocessableEntity, false},
		{"another key", "k2", body, http.StatusCreated, false},
		{"no key", "", body, http.StatusBadRequest, false},
		{"no amount", "k3", `{"account":"acct_1","currency":"EUR"}`, http.StatusBadRequest, false},
	} {
		r := do(t, "POST", srv.URL+"/charges", "", tc.key, tc.body)
		if r.status != tc.status || r.replayed() != tc.replayed {
			t.Errorf("%s: %v (replayed %v), want %d (replayed %v)", tc.name, r, r.replayed(), tc.status, tc.replayed)
		}
	}
	all := listCharges(t, srv.URL, "")
	if len(all) != 2 || all[0].IdempotencyKey != "k1" || all[1].IdempotencyKey != "k2" {
		t.Fatalf("charges %+v, want k1's and k2's", all)
	}
	if k1 := listCharges(t, srv.URL, "k1"); len(k1) != 1 || k1[0] != all[0] {
		t.Fatalf("charges of k1: %+v, want %+v", k1, all[0])
	}
	if none := listCharges(t, srv.URL, "nope"); len(none) != 0 {
		t.Fatalf("charges of an unknown key: %+v", none)
	}
}

// listCharges lists the provider's charges, those of idempotency key key
// when it is not empty.
func listCharges(t testing.TB, base, key string) []Charge {
	t.Helper()
	url := base + "/charges"
	if key != "" {
		url += "?idempotency_key=" + key
	}
	r := do(t, "GET", url, "", "", "")
	var out struct{ Charges []Charge }
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if r.status != http.StatusOK || dec.Decode(&out) != nil || out.Charges == nil {
		t.Fatalf("GET %s: %v", url, r)
	}
	return out.Charges
}

// chargesOf returns account's charges.
func chargesOf(t testing.TB, base, account string) []Charge {
	var out []Charge
	for _, c := range listCharges(t, base, "") {
		if c.Account == account {
			out = append(out, c)
		}
	}
	return out
}

// TestProviderPayment: through the provider, a payment and its replays
// charge once, and the payment is the charge's.
func TestProviderPayment(t *testing.T) {
	t.Parallel()
	prov := startService(t, "-provider-only")
	args, _ := storeArgs(t, "sqlite")
	svc := startService(t, append(args, "-provider-url", prov.base)...)
	acct, key := account(t), "prov-"+randHex(4)
	first := do(t, "POST", svc.base+"/payments", acct, key, payBody)
	again := do(t, "POST", svc.base+"/payments", acct, key, payBody)
	if first.status != http.StatusCreated || !again.replayed() || !bytes.Equal(first.body, again.body) {
		t.Fatalf("payment %v, retry %v: want 201 and its replay", first, again)
	}
	cs := chargesOf(t, prov.base, acct)
	if len(cs) != 1 {
		t.Fatalf("%d charges for one payment: %+v", len(cs), cs)
	}
	if p := decodePayment(t, first); p.ID != paymentOf(cs[0]).ID || p.Amount != cs[0].Amount || p.Currency != cs[0].Currency {
		t.Fatalf("payment %+v is not the charge %+v", p, cs[0])
	}
}

// TestProviderCrashDrill SIGKILLs the service after the provider charged
// and before the payment committed (the handler sleeps crashDelay between
// the two), restarts it and retries until 201: one charge, one payment,
// the payment is the charge's, and Reconcile answered from the charge
// instead of running the handler again.
func TestProviderCrashDrill(t *testing.T) {
	for _, store := range []string{"sqlite", "pgx", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			testProviderCrash(t, store)
		})
	}
}

func testProviderCrash(t *testing.T, store string) {
	prov := startService(t, "-provider-only")
	args, _ := storeArgs(t, store)
	args = append(args, "-provider-url", prov.base, "-handler-delay", crashDelay.String(),
		"-request-timeout", crashTimeout.String(), "-store-timeout", crashStoreTO.String(), "-lease", crashLease.String())
	first := startService(t, args...)
	acct, key := account(t), "drill-"+randHex(4)

	sent := time.Now()
	go func() { _, _ = tryDo("POST", first.base+"/payments", acct, key, payBody) }()
	// Kill as soon as the provider has the charge: the handler then
	// sleeps crashDelay before the commit.
	var charged time.Duration
	for deadline := time.Now().Add(crashDelay); ; time.Sleep(10 * time.Millisecond) {
		if len(chargesOf(t, prov.base, acct)) > 0 {
			charged = time.Since(sent)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the provider has no charge %v after the request", crashDelay)
		}
	}
	first.kill()
	killed := time.Since(sent)
	if killed-charged >= crashDelay/2 {
		t.Fatalf("killed %v after the charge: too close to the commit to prove anything", killed-charged)
	}

	second := startService(t, args...)
	// What the crash left: nothing on a store with a shared transaction;
	// on redis the payment row if the kill came after its insert (it is
	// written right after the charge, outside any transaction), or not.
	left := listPayments(t, second.base, acct)
	if max := map[bool]int{true: 1, false: 0}[store == "redis"]; len(left) > max {
		t.Fatalf("after the crash %s has %d payments, want at most %d: %+v", acct, len(left), max, left)
	}
	var (
		conflicts int
		ok        reply
		okSent    time.Duration
		okTook    time.Duration
	)
	for deadline := time.Now().Add(3 * crashLease); ; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no 201 within %v of the restart (%d 409s)", 3*crashLease, conflicts)
		}
		at := time.Since(sent)
		r := do(t, "POST", second.base+"/payments", acct, key, payBody)
		if r.status == http.StatusConflict {
			conflicts++
			continue
		}
		if r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("retry after the crash: %v (replayed %v), want the reconciled 201", r, r.replayed())
		}
		ok, okSent, okTook = r, at, time.Since(sent)-at
		break
	}
	charges := chargesOf(t, prov.base, acct)
	payments := wantPayments(t, second.base, acct, 1)
	t.Logf("%s: charged at %v, killed at %v, %d payment row(s) left, %d retries refused, 201 sent at %v took %v; %d charge(s), %d payment(s)",
		store, charged.Round(time.Millisecond), killed.Round(time.Millisecond), len(left), conflicts,
		okSent.Round(time.Millisecond), okTook.Round(time.Millisecond), len(charges), len(payments))
	if len(charges) != 1 {
		t.Fatalf("%d charges after the crash and the retry, want 1: %+v", len(charges), charges)
	}
	p := decodePayment(t, ok)
	if p != payments[0] || p.ID != paymentOf(charges[0]).ID || p.Amount != charges[0].Amount {
		t.Fatalf("answered %+v, listed %+v, charged %+v: want one payment, the charge's", p, payments[0], charges[0])
	}
	// Reconcile answered from the charge: the handler, which sleeps
	// crashDelay, did not run again.
	if okTook >= crashDelay {
		t.Errorf("the takeover took %v: the handler ran again instead of Reconcile answering from the charge", okTook)
	}
	if len(left) == 0 && !strings.Contains(second.logs.String(), "reconciled a stale claim from the provider's charge") {
		t.Errorf("no reconcile from the provider logged")
	}
	if len(left) == 1 && left[0] != p {
		t.Fatalf("the retry answered %+v, not the payment the crashed attempt wrote %+v", p, left[0])
	}
	if r := do(t, "POST", second.base+"/payments", acct, key, payBody); !r.replayed() || !bytes.Equal(r.body, ok.body) {
		t.Fatalf("retry after recovery: %v, want the replay of %s", r, ok.body)
	}
}
