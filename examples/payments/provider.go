package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	idem "github.com/idemgo/idem/core"
)

// The fake payment provider (-provider-only) stands for the card processor
// a real payments service calls: an effect outside the service's database,
// which the idempotency transaction cannot roll back. Like real providers
// it deduplicates by an idempotency key: the first POST /charges with a key
// charges, every later one answers that charge. The service
// (-provider-url) sends it idem.DownstreamKey(ctx, "charge"), the same for
// every attempt at one payment, so a retry after a crash charges nothing
// more, and its Reconcile asks it what became of a crashed attempt.

// Charge is one charge as the provider stores and renders it.
type Charge struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	Account        string    `json:"account"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Description    string    `json:"description"`
	CreatedAt      time.Time `json:"created_at"`
}

// chargeStep names the provider call for idem.DownstreamKey.
const chargeStep = "charge"

// fakeProvider is the provider's state: its charges, oldest first, in
// memory. It lives as long as its process.
type fakeProvider struct {
	mu      sync.Mutex
	charges []Charge
	byKey   map[string]int // idempotency key → index in charges
}

func newFakeProvider() *fakeProvider { return &fakeProvider{byKey: make(map[string]int)} }

// handler serves the provider's API (README, "The fake payment provider").
func (f *fakeProvider) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", f.charge)
	mux.HandleFunc("GET /charges", f.list)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeReply(w, jsonReply(http.StatusOK, map[string]string{"status": "ok"}))
	})
	return mux
}

// charge handles POST /charges: 201 and the new charge, or 200 and the
// charge made earlier with this Idempotency-Key (422 when that one was for
// another account, amount, currency or description).
func (f *fakeProvider) charge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var in struct {
		Account     string `json:"account"`
		Amount      int64  `json:"amount"`
		Currency    string `json:"currency"`
		Description string `json:"description"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if key == "" || len(key) > 255 || err != nil || in.Account == "" || in.Amount <= 0 || !currencyRE.MatchString(in.Currency) {
		writeReply(w, problem(http.StatusBadRequest, ProblemBase+"provider", "Invalid charge",
			"POST /charges needs an Idempotency-Key and {\"account\", \"amount\" > 0, \"currency\", \"description\"}."))
		return
	}
	f.mu.Lock()
	i, seen := f.byKey[key]
	if !seen {
		var b [12]byte
		_, _ = rand.Read(b[:])
		f.charges = append(f.charges, Charge{
			ID: "ch_" + hex.EncodeToString(b[:]), IdempotencyKey: key, Account: in.Account, Amount: in.Amount,
			Currency: in.Currency, Description: in.Description, CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
		})
		i = len(f.charges) - 1
		f.byKey[key] = i
	}
	c := f.charges[i]
	f.mu.Unlock()
	switch {
	case !seen:
		writeReply(w, jsonReply(http.StatusCreated, c))
	case c.Account != in.Account || c.Amount != in.Amount || c.Currency != in.Currency || c.Description != in.Description:
		writeReply(w, problem(http.StatusUnprocessableEntity, ProblemBase+"provider", "Idempotency-Key reused",
			"This Idempotency-Key charged another request."))
	default:
		rep := jsonReply(http.StatusOK, c)
		rep.Header.Set(idem.ReplayedHeader, "true")
		writeReply(w, rep)
	}
}

// list handles GET /charges: every charge, oldest first, or with
// ?idempotency_key= the one made with that key (none or one).
func (f *fakeProvider) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	cs := slices.Clone(f.charges)
	f.mu.Unlock()
	if key := r.URL.Query().Get("idempotency_key"); key != "" {
		cs = slices.DeleteFunc(cs, func(c Charge) bool { return c.IdempotencyKey != key })
	}
	if cs == nil {
		cs = []Charge{}
	}
	writeReply(w, jsonReply(http.StatusOK, struct {
		Charges []Charge `json:"charges"`
	}{cs}))
}

// providerClient charges through the provider at base (-provider-url).
type providerClient struct {
	base string
	hc   *http.Client
}

// errProviderKeyReused: the provider refused the key (422), which only a
// second payment under one downstream key could cause.
var errProviderKeyReused = errors.New("provider: idempotency key reused with another charge")

func newProviderClient(base string) *providerClient {
	return &providerClient{base: strings.TrimSuffix(base, "/"), hc: &http.Client{Timeout: 10 * time.Second}}
}

// Charge charges p's account under key. Whatever the number of calls with
// one key, the provider charges once and answers that charge.
func (pc *providerClient) Charge(ctx context.Context, key string, p Payment) (Charge, error) {
	body, _ := json.Marshal(map[string]any{
		"account": p.Account, "amount": p.Amount, "currency": p.Currency, "description": p.Description,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, pc.base+"/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, fmt.Errorf("provider: charge: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	var c Charge
	status, err := pc.do(req, &c)
	switch {
	case err != nil:
		return Charge{}, fmt.Errorf("provider: charge: %w", err)
	case status == http.StatusUnprocessableEntity:
		return Charge{}, errProviderKeyReused
	case status != http.StatusCreated && status != http.StatusOK:
		return Charge{}, fmt.Errorf("provider: charge: status %d", status)
	}
	return c, nil
}

// Lookup returns the charge made under key, found false when there is
// none.
func (pc *providerClient) Lookup(ctx context.Context, key string) (_ Charge, found bool, _ error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pc.base+"/charges?idempotency_key="+key, nil)
	if err != nil {
		return Charge{}, false, fmt.Errorf("provider: lookup: %w", err)
	}
	var out struct{ Charges []Charge }
	status, err := pc.do(req, &out)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("status %d", status)
	}
	if err != nil {
		return Charge{}, false, fmt.Errorf("provider: lookup: %w", err)
	}
	if len(out.Charges) == 0 {
		return Charge{}, false, nil
	}
	return out.Charges[0], true, nil
}

func (pc *providerClient) do(req *http.Request, v any) (int, error) {
	resp, err := pc.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated {
		if err := json.Unmarshal(b, v); err != nil {
			return 0, fmt.Errorf("decode %q: %w", b, err)
		}
	}
	return resp.StatusCode, nil
}

// paymentOf is the payment a charge pays for: its id follows from the
// charge's, so the handler and Reconcile, whichever writes it, write the
// same payment.
func paymentOf(c Charge) Payment {
	return Payment{
		ID: "pay_" + strings.TrimPrefix(c.ID, "ch_"), Account: c.Account, Amount: c.Amount, Currency: c.Currency,
		Description: c.Description, Status: "succeeded", CreatedAt: c.CreatedAt,
	}
}

// providerReconcile is the engine's Config.Reconcile with a provider: after
// a stale claim was taken over it asks the provider whether the crashed
// attempt charged. It did: the payment is written from the charge, in the
// taken-over attempt's transaction, and its 201 stored and answered without
// running the handler again. It did not: nil, and the handler runs (and
// charges, under the same key). next, when set, is asked first (-store
// redis looks for the row the crashed attempt committed).
func providerReconcile(pc *providerClient, repo Repository, next idem.Reconciler, log *slog.Logger) idem.Reconciler {
	return func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
		if next != nil {
			if resp, err := next(ctx, stale); resp != nil || err != nil {
				return resp, err
			}
		}
		key, err := idem.DownstreamKey(ctx, chargeStep)
		if err != nil {
			return nil, err
		}
		c, found, err := pc.Lookup(ctx, key)
		if err != nil || !found {
			return nil, err
		}
		p := paymentOf(c)
		if kr, ok := repo.(keyedRepository); ok {
			p, _, err = kr.InsertOnce(ctx, p)
		} else {
			err = repo.Insert(ctx, p)
		}
		if err != nil {
			return nil, fmt.Errorf("reconcile: write the charged payment: %w", err)
		}
		log.InfoContext(ctx, "reconciled a stale claim from the provider's charge",
			slog.String("charge", c.ID), slog.String("payment", p.ID))
		rep := createdReply(p)
		return &idem.Response{Status: rep.Status, Header: rep.Header, Body: rep.Body}, nil
	}
}
