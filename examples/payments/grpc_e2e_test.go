package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	idemgrpc "github.com/idemgo/idem/adapters/grpc"
	"github.com/idemgo/idem/examples/payments/paymentsv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

var grpcAddrRE = regexp.MustCompile(`msg="payments gRPC listening" addr=(\S+)`)

// grpcClient dials the gRPC API of p (started with -grpc-addr).
func grpcClient(t *testing.T, p *proc) paymentsv1.PaymentsClient {
	t.Helper()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := grpcAddrRE.FindStringSubmatch(p.logs.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("no gRPC listen line in the log:\n%s", p.logs)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return paymentsv1.NewPaymentsClient(conn)
}

func grpcCtx(account, key string) context.Context {
	md := metadata.MD{}
	if account != "" {
		md.Set("authorization", "Bearer "+account)
	}
	if key != "" {
		md.Set("idempotency-key", key)
	}
	return metadata.NewOutgoingContext(context.Background(), md)
}

// TestGRPCAPI drives -grpc-addr: a first CreatePayment, its replay, the
// same key with another request, an invalid payment stored and replayed,
// the 409-equivalent while a call holds the key, ListPayments, and the
// HTTP API seeing the same payments.
func TestGRPCAPI(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "sqlite", "pgx", "gorm-mysql"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			testGRPCAPI(t, store)
		})
	}
}

func testGRPCAPI(t *testing.T, store string) {
	p := startService(t, "-store", store, "-dsn", newDatabase(t, store), "-grpc-addr", "127.0.0.1:0", "-handler-delay", "400ms")
	c := grpcClient(t, p)
	account, key := "acct_"+randHex(4), "k-"+randHex(8)
	req := &paymentsv1.CreatePaymentRequest{Amount: 1000, Currency: "EUR", Description: "coffee"}

	var h1, h2 metadata.MD
	first, err := c.CreatePayment(grpcCtx(account, key), req, grpc.Header(&h1))
	if err != nil || first.Id == "" || first.Status != "succeeded" || len(h1.Get(idemgrpc.ReplayedKey)) != 0 {
		t.Fatalf("first: %v, %v, header %v", first, err, h1)
	}
	again, err := c.CreatePayment(grpcCtx(account, key), req, grpc.Header(&h2))
	if err != nil || again.Id != first.Id || again.CreatedAt != first.CreatedAt || h2.Get(idemgrpc.ReplayedKey)[0] != "true" {
		t.Fatalf("replay: %v, %v, header %v", again, err, h2)
	}
	_, err = c.CreatePayment(grpcCtx(account, key), &paymentsv1.CreatePaymentRequest{Amount: 5, Currency: "EUR"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("other request under the key: %v", err)
	}
	_, err = c.CreatePayment(grpcCtx("", "k-anon"), req)
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}

	// An invalid payment is a deterministic error: stored and replayed.
	bad := "k-bad-" + randHex(4)
	for i, wantReplayed := range []bool{false, true} {
		var h metadata.MD
		_, err := c.CreatePayment(grpcCtx(account, bad), &paymentsv1.CreatePaymentRequest{Amount: 1, Currency: "eur"}, grpc.Header(&h))
		if status.Code(err) != codes.InvalidArgument || (len(h.Get(idemgrpc.ReplayedKey)) == 1) != wantReplayed {
			t.Fatalf("invalid payment, call %d: %v, header %v", i+1, err, h)
		}
	}

	// Two calls racing on one key: one runs, the other is Aborted with a
	// RetryInfo. On SQLite the claim of a new key waits for the single
	// writer, so there the later call may instead wait and get the replay;
	// either way the payment is made once.
	race := "k-race-" + randHex(4)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	paid := make([]*paymentsv1.Payment, 2)
	headers := make([]metadata.MD, 2)
	for i := range errs {
		wg.Go(func() { paid[i], errs[i] = c.CreatePayment(grpcCtx(account, race), req, grpc.Header(&headers[i])) })
	}
	wg.Wait()
	var aborted, replayed int
	for i, err := range errs {
		switch {
		case status.Code(err) == codes.Aborted:
			if d, ok := idemgrpc.RetryDelay(err); !ok || d < time.Second {
				t.Fatalf("Aborted without a RetryInfo: %v", err)
			}
			aborted++
		case err != nil:
			t.Fatalf("racing call: %v", err)
		case len(headers[i].Get(idemgrpc.ReplayedKey)) == 1:
			replayed++
		}
	}
	switch {
	case aborted == 1:
	case store == "sqlite" && replayed == 1 && paid[0].Id == paid[1].Id:
	default:
		t.Fatalf("racing calls: %v (%d replayed), want one Aborted", errs, replayed)
	}

	list, err := c.ListPayments(grpcCtx(account, ""), &paymentsv1.ListPaymentsRequest{})
	if err != nil || len(list.Payments) != 2 || list.Payments[0].Id != first.Id {
		t.Fatalf("list: %v, %v", list, err)
	}
	// The HTTP API serves the same store.
	hreq, _ := http.NewRequest(http.MethodGet, p.base+"/payments", nil)
	hreq.Header.Set("Authorization", "Bearer "+account)
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var hl struct {
		Payments []Payment `json:"payments"`
	}
	if err := json.Unmarshal(body, &hl); err != nil || len(hl.Payments) != 2 || hl.Payments[0].ID != first.Id {
		t.Fatalf("HTTP list: %s", body)
	}
	t.Logf("first %s; replay idempotent-replayed=%v; other request: %v; racing: %v",
		first.Id, h2.Get(idemgrpc.ReplayedKey), codes.FailedPrecondition, errs)
}
