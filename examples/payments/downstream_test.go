package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// syncFailingStore is a memstore whose transactions are Syncers that fail,
// as the PostgreSQL stores' do when the database stops answering between
// the claim and the handler's DownstreamKey.
type syncFailingStore struct{ idemstore.Store }

type syncFailingTx struct{ idemstore.Tx }

var errSyncDown = errors.New("sync: server closed the connection")

func (syncFailingTx) Sync(context.Context) error { return errSyncDown }

func (s syncFailingStore) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	ctx, tx, err := s.Store.BeginTx(ctx, l)
	if err != nil {
		return ctx, nil, err
	}
	return ctx, syncFailingTx{tx}, nil
}

// countingRepo counts the payments written.
type countingRepo struct{ inserts int }

func (r *countingRepo) Insert(context.Context, Payment) error { r.inserts++; return nil }
func (r *countingRepo) List(context.Context, string) ([]Payment, error) {
	return nil, nil
}
func (r *countingRepo) Get(context.Context, string, string) (Payment, error) {
	return Payment{}, errNoPayment
}

// TestDownstreamKeyUnavailable: when the claim cannot be made durable
// before the charge (DownstreamKey's Sync fails), the payment is answered
// 503 storage-unavailable, a transient failure the client retries, not a
// 500; nothing is charged or written, and the key is released so that the
// retry runs the payment.
func TestDownstreamKeyUnavailable(t *testing.T) {
	fake := newFakeProvider()
	provider := httptest.NewServer(fake.handler())
	defer provider.Close()
	mem := memstore.MustNew()
	eng, err := idem.New(idem.Config{Store: syncFailingStore{mem}, FingerprintKey: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	repo := &countingRepo{}
	svc := &Service{Repo: repo, Provider: newProviderClient(provider.URL), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}

	att, resp := eng.Begin(context.Background(), idem.Request{Method: http.MethodPost, Path: "/payments",
		Principal: "acct_sync", Key: "sync-1", ContentType: "application/json", Body: strings.NewReader(payBody)})
	if att == nil {
		t.Fatalf("not claimed: %d %s", resp.Status, resp.Body)
	}
	rep := svc.Create(att.Context(), "acct_sync", att.Body(), "")
	resp = att.Finish(idem.Result{Status: rep.Status, Header: rep.Header, Body: rep.Body})

	r := reply{status: resp.Status, header: resp.Header, body: resp.Body}
	if want := ProblemBase + "storage-unavailable"; r.status != http.StatusServiceUnavailable || r.problemType() != want {
		t.Fatalf("DownstreamKey's Sync failed: answered %v, want 503 %s", r, want)
	}
	if n := len(listCharges(t, provider.URL, "")); n != 0 || repo.inserts != 0 {
		t.Fatalf("%d charges and %d payments written, want none", n, repo.inserts)
	}
	if rec, free := storetest.Free(t, mem, "acct_sync", "sync-1"); !free {
		t.Fatalf("after the 503 the key holds %+v, want it released", rec)
	}
}
