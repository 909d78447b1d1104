package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// PaymentService is a plain service with no transport: its callers (an
// HTTP handler, a gRPC method, a queue consumer, a CLI) pass the account,
// the client's idempotency key and the request.
type PaymentService struct {
	idem    *idem.Engine
	charges int
}

// CreatePaymentRequest is the service method's input.
type CreatePaymentRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// CreatePayment charges once per (account, key): a retry gets the first
// call's payment back, a second request under the same key is refused.
func (s *PaymentService) CreatePayment(ctx context.Context, account, key string, req CreatePaymentRequest) (string, error) {
	input, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	res, err := s.idem.Do(ctx, idem.Call{
		Principal: account, Key: key, Operation: "CreatePayment",
		Encoding: "application/json", Input: input,
	}, func(ctx context.Context) (idem.Response, error) {
		// Write through the store's transaction here (idempgx.Tx(ctx),
		// idemgorm.Tx(ctx)): it commits with the stored result.
		s.charges++
		return idem.Response{Status: 201, Body: fmt.Appendf(nil, "pay_%d", s.charges)}, nil
	})
	if err != nil {
		return "", err
	}
	return string(res.Body), nil
}

// ExampleEngine_Do makes a plain service method idempotent, with no
// transport at all.
func ExampleEngine_Do() {
	engine, err := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: memstore.MustNew()})
	if err != nil {
		panic(err)
	}
	svc := &PaymentService{idem: engine}
	ctx := context.Background()

	first, _ := svc.CreatePayment(ctx, "acct_1", "7f3a", CreatePaymentRequest{Amount: 1000, Currency: "EUR"})
	retry, _ := svc.CreatePayment(ctx, "acct_1", "7f3a", CreatePaymentRequest{Amount: 1000, Currency: "EUR"})
	_, err = svc.CreatePayment(ctx, "acct_1", "7f3a", CreatePaymentRequest{Amount: 5, Currency: "EUR"})
	var ce *idem.CallError
	fmt.Println(first, retry, "charges:", svc.charges)
	fmt.Println(errors.As(err, &ce), ce.Problem == idem.ProblemKeyReused, ce.Status())
	// Output:
	// pay_1 pay_1 charges: 1
	// true true 422
}
