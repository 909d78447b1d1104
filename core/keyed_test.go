package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// TestFingerprintKeyRequired: New refuses a Config without a fingerprint
// key, or with a key (current or previous) too short to be a secret, and
// its error names the field.
func TestFingerprintKeyRequired(t *testing.T) {
	t.Parallel()
	short := []byte("0123456789abcdef0123456789abcde") // 31 bytes
	tests := []struct {
		name string
		cfg  idem.Config
		want string
	}{
		{"no key", idem.Config{Store: memstore.MustNew()}, "FingerprintKey is required"},
		{"short key", idem.Config{Store: memstore.MustNew(), FingerprintKey: short}, "FingerprintKey is required"},
		{"short previous key", idem.Config{Store: memstore.MustNew(), FingerprintKey: storetest.FingerprintKey,
			PreviousFingerprintKeys: [][]byte{storetest.FingerprintKey, short}}, "PreviousFingerprintKeys[1]"},
	}
	for _, tc := range tests {
		_, err := idem.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := idem.New(idem.Config{Store: memstore.MustNew(), FingerprintKey: append(short, 'f')}); err != nil {
		t.Errorf("New with a %d-byte key = %v", idem.MinFingerprintKeyBytes, err)
	}
}

// TestStoredFingerprintNeedsTheKey: whoever reads a stored fingerprint can
// recover a small field of the request (here the CVV, 1000 candidates) by
// trying every value if and only if it holds the key. Without it (the
// unkeyed SHA-256 v1 construction, or any other key) no candidate matches.
func TestStoredFingerprintNeedsTheKey(t *testing.T) {
	t.Parallel()
	key := []byte("the service's secret fingerprint key, 32+ bytes")
	store := memstore.MustNew()
	e, err := idem.New(idem.Config{Store: store, FingerprintKey: key})
	if err != nil {
		t.Fatal(err)
	}
	body := func(cvv string) string {
		return `{"amount":1250,"currency":"EUR","cvv":"` + cvv + `","card_last4":"4242"}`
	}
	req := idem.Request{Method: "POST", Path: "/payments", Principal: "alice", Key: "k-1",
		ContentType: "application/json", Body: strings.NewReader(body("737")), ContentLength: -1}
	att, resp := e.Begin(context.Background(), req)
	if att == nil {
		t.Fatalf("Begin: %d %s", resp.Status, resp.Body)
	}
	att.Finish(idem.Result{Status: http.StatusBadRequest})
	rec, err := store.Get(context.Background(), "alice", "k-1")
	if err != nil {
		t.Fatal(err)
	}
	stored := rec.Fingerprint

	// The attacker knows everything but the CVV and, in the first case, the key.
	guess := map[string]func(cvv string) []byte{
		"with the key": func(cvv string) []byte {
			return idemadapter.Fingerprint(key, "POST", "/payments", "alice", "application/json", []byte(body(cvv)), nil)
		},
		"another key": func(cvv string) []byte {
			return idemadapter.Fingerprint([]byte("a guessed key that is not the service's"), "POST", "/payments", "alice", "application/json", []byte(body(cvv)), nil)
		},
		"empty key": func(cvv string) []byte {
			return idemadapter.Fingerprint(nil, "POST", "/payments", "alice", "application/json", []byte(body(cvv)), nil)
		},
		// The v1 construction: SHA-256 of the same input, no key.
		"unkeyed SHA-256": func(cvv string) []byte {
			canon, err := idem.CanonicalJSON([]byte(body(cvv)), nil)
			if err != nil {
				t.Fatal(err)
			}
			in := []byte("idem/fingerprint/v1")
			for _, f := range []struct {
				tag byte
				s   string
			}{{'m', "POST"}, {'p', "/payments"}, {'u', "alice"}} {
				in = binary.AppendUvarint(append(in, f.tag), uint64(len(f.s)))
				in = append(in, f.s...)
			}
			in = binary.BigEndian.AppendUint64(append(in, 'j'), uint64(len(canon)))
			sum := sha256.Sum256(append(in, canon...))
			return append([]byte{idemadapter.FingerprintVersion}, sum[:]...) // compared with the stored MAC
		},
	}
	for name, fp := range guess {
		var found []string
		for i := range 1000 {
			cvv := fmt.Sprintf("%03d", i)
			if bytes.Equal(fp(cvv), stored) {
				found = append(found, cvv)
			}
		}
		want := 0
		if name == "with the key" {
			want = 1
		}
		if len(found) != want || (want == 1 && found[0] != "737") {
			t.Errorf("%s: brute force over 1000 CVVs found %v", name, found)
		}
	}
}

// claimWatchesContext is a store whose Claim fails on a context that is
// done, as the SQL stores' do.
type claimWatchesContext struct{ idemstore.Store }

func (s claimWatchesContext) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.ClaimResult{}, err
	}
	return s.Store.Claim(ctx, req)
}

// TestFingerprintKeyRotation: after FingerprintKey is replaced and the old
// key moved to PreviousFingerprintKeys, a record fingerprinted under the old
// key still replays for the same request, refuses another (422), and its
// stale claim is taken over; without the old key the same retry gets 422.
func TestFingerprintKeyRotation(t *testing.T) {
	t.Parallel()
	oldKey := []byte("the fingerprint key before the rotation")
	newKey := []byte("the fingerprint key after the rotation!!")
	clk := newClock()
	store := claimWatchesContext{memstore.MustNew(memstore.WithClock(clk.Now))}
	engine := func(key []byte, previous ...[]byte) *idem.Engine {
		e, err := idem.New(idem.Config{Store: store, FingerprintKey: key, PreviousFingerprintKeys: previous,
			RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	before, rotated, forgot := engine(oldKey), engine(newKey, oldKey), engine(newKey)
	req := func(key, amount string) idem.Request {
		return idem.Request{Method: "POST", Path: "/payments", Principal: "alice", Key: key,
			ContentType: "application/json", Body: strings.NewReader(`{"amount":` + amount + `}`), ContentLength: -1}
	}
	answer := func(resp *idem.Response) string {
		if resp == nil {
			return "a claim"
		}
		return fmt.Sprintf("%d %s", resp.Status, resp.Body)
	}

	att, _ := before.Begin(context.Background(), req("settled", "1"))
	if att == nil {
		t.Fatal("first attempt did not claim")
	}
	att.Finish(idem.Result{Status: http.StatusCreated, Body: []byte("ch_1")})
	if _, resp := forgot.Begin(context.Background(), req("settled", "1")); resp == nil || resp.Status != http.StatusUnprocessableEntity {
		t.Fatalf("retry without the previous key: %s, want 422", answer(resp))
	}
	if _, resp := rotated.Begin(context.Background(), req("settled", "1")); resp == nil || resp.Status != http.StatusCreated ||
		string(resp.Body) != "ch_1" || resp.Header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("retry with the previous key: %s, want the replayed 201", answer(resp))
	}
	if _, resp := rotated.Begin(context.Background(), req("settled", "2")); resp == nil || resp.Status != http.StatusUnprocessableEntity {
		t.Fatalf("another request with the previous key: %s, want 422", answer(resp))
	}

	// A claim made under the old key whose holder died is taken over by the
	// same request under the new key, and keeps its downstream key.
	crashed, _ := before.Begin(context.Background(), req("crashed", "1"))
	if crashed == nil {
		t.Fatal("crashed attempt did not claim")
	}
	dk, err := idem.DownstreamKey(crashed.Context(), "charge")
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(4 * time.Second)
	if _, resp := rotated.Begin(context.Background(), req("crashed", "2")); resp == nil || resp.Status != http.StatusUnprocessableEntity {
		t.Fatalf("another request on the stale claim: %s, want 422", answer(resp))
	}
	retry, resp := rotated.Begin(context.Background(), req("crashed", "1"))
	if retry == nil {
		t.Fatalf("retry of the stale claim with the previous key: %d %s, want a takeover", resp.Status, resp.Body)
	}
	if got, _ := idem.DownstreamKey(retry.Context(), "charge"); got != dk {
		t.Fatalf("takeover's downstream key %s, want the crashed attempt's %s", got, dk)
	}
	if r := retry.Finish(idem.Result{Status: http.StatusCreated}); r.Status != http.StatusCreated {
		t.Fatalf("takeover's finish: %d %s", r.Status, r.Body)
	}
}

// TestRecordNoncePerRecord: the engine sends every claim a fresh random
// nonce, so a record made after an earlier one expired carries a new one
// and a new downstream key: a provider that keeps keys longer than
// Retention charges the new request instead of answering with the expired
// record's charge. A takeover of a stale claim keeps the record's nonce
// and its downstream key.
func TestRecordNoncePerRecord(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store,
		RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{charges: map[string]string{}}
	// claim begins an attempt at pay-1 and charges the provider with its
	// downstream key; it returns the attempt, the stored nonce and the key.
	claim := func() (*idem.Attempt, string, string) {
		t.Helper()
		att, resp := e.Begin(context.Background(), request("alice", "pay-1"))
		if att == nil {
			t.Fatalf("Begin: %d %s, want a claim", resp.Status, resp.Body)
		}
		rec, err := store.Get(context.Background(), "alice", "pay-1")
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Nonce) != 32 {
			t.Fatalf("stored nonce %q, want 32 hex digits", rec.Nonce)
		}
		k, err := idem.DownstreamKey(att.Context(), "charge")
		if err != nil {
			t.Fatal(err)
		}
		if of := idem.DownstreamKeyOf("alice", "pay-1", rec.Nonce, "charge"); of != k {
			t.Fatalf("DownstreamKeyOf the stored record = %s, DownstreamKey = %s", of, k)
		}
		p.charge(k)
		return att, rec.Nonce, k
	}
	_, nonce, key := claim() // the holder dies after charging
	clk.Add(4 * time.Second)
	takeover, kept, keptKey := claim()
	if kept != nonce || keptKey != key {
		t.Fatalf("takeover: nonce %s and downstream key %s, want the first attempt's %s and %s", kept, keptKey, nonce, key)
	}
	takeover.Finish(idem.Result{Status: http.StatusCreated})
	if p.real != 1 {
		t.Fatalf("the provider charged %d times for one record, want 1", p.real)
	}
	clk.Add(2 * time.Hour)
	if _, fresh, freshKey := claim(); fresh == nonce || freshKey == key {
		t.Fatalf("re-claim after expiry: nonce %s and downstream key %s, the expired record's", fresh, freshKey)
	}
	if p.real != 2 {
		t.Fatalf("the provider charged %d times for two records of one key, want 2", p.real)
	}
}

// TestDownstreamKeyStableAcrossRelease: a handler that called the provider
// and then failed (a 5xx, a failed commit: the key is released) is retried
// with the same downstream key, so the provider charges once: the released
// record keeps its nonce (storetest's ReleaseKeepsNonce proves every store
// does).
func TestDownstreamKeyStableAcrossRelease(t *testing.T) {
	t.Parallel()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew()})
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{charges: map[string]string{}}
	for i, status := range []int{http.StatusBadGateway, http.StatusCreated} {
		att, resp := e.Begin(context.Background(), request("alice", "pay-release"))
		if att == nil {
			t.Fatalf("attempt %d: %d %s, want a claim", i, resp.Status, resp.Body)
		}
		key, err := idem.DownstreamKey(att.Context(), "charge")
		if err != nil {
			t.Fatal(err)
		}
		p.charge(key)
		if r := att.Finish(idem.Result{Status: status}); r.Status != status {
			t.Fatalf("attempt %d: %d, want %d", i, r.Status, status)
		}
	}
	if p.real != 1 {
		t.Fatalf("the provider charged %d times across a released attempt and its retry, want 1", p.real)
	}
}

// TestConfigHidesTheKey: Engine.Config, which services read back for their
// start-up log, carries no fingerprint key, while the engine still uses it.
func TestConfigHidesTheKey(t *testing.T) {
	t.Parallel()
	prev := []byte("an older key of at least thirty-two bytes")
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, PreviousFingerprintKeys: [][]byte{prev},
		Store: memstore.MustNew()})
	if err != nil {
		t.Fatal(err)
	}
	if c := e.Config(); c.FingerprintKey != nil || c.PreviousFingerprintKeys != nil {
		t.Fatalf("Config() returned the keys: %q %q", c.FingerprintKey, c.PreviousFingerprintKeys)
	}
	if att, resp := e.Begin(context.Background(), request("alice", "k")); att == nil {
		t.Fatalf("the engine lost its key: %d %s", resp.Status, resp.Body)
	}
}
