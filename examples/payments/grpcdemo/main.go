// Command grpcdemo is a small client of the payments example's gRPC API:
// a first CreatePayment, its replay, the same key with another request,
// and two calls racing on a new key (run the service with -handler-delay
// to see the in-progress answer).
//
//	go run ./examples/payments -grpc-addr 127.0.0.1:9090 -handler-delay 1s
//	go run ./examples/payments/grpcdemo -addr 127.0.0.1:9090
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"sync"

	idemgrpc "github.com/idemgo/idem/adapters/grpc"
	"github.com/idemgo/idem/examples/payments/paymentsv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9090", "the service's -grpc-addr")
	account := flag.String("account", "alice", "the bearer token: the account")
	flag.Parse()
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	c := paymentsv1.NewPaymentsClient(conn)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	key := "order-" + hex.EncodeToString(b)
	ctx := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+*account, "idempotency-key", key)
	}
	call := func(what, key string, r *paymentsv1.CreatePaymentRequest) {
		var header metadata.MD
		p, err := c.CreatePayment(ctx(key), r, grpc.Header(&header))
		if err != nil {
			st := status.Convert(err)
			d, ok := idemgrpc.RetryDelay(err)
			retry := ""
			if ok {
				retry = fmt.Sprintf(" (RetryInfo %v)", d)
			}
			fmt.Printf("%-28s %s: %s%s\n", what, st.Code(), st.Message(), retry)
			return
		}
		fmt.Printf("%-28s OK %s %d %s, idempotent-replayed=%v\n", what, p.Id, p.Amount, p.Currency, header.Get(idemgrpc.ReplayedKey))
	}
	req := &paymentsv1.CreatePaymentRequest{Amount: 1250, Currency: "EUR", Description: "Order #1001"}
	call("1. first call", key, req)
	call("2. retry, same key", key, req)
	call("3. same key, other amount", key, &paymentsv1.CreatePaymentRequest{Amount: 99, Currency: "EUR"})
	var wg sync.WaitGroup
	race := key + "-race"
	for i := range 2 {
		wg.Go(func() { call(fmt.Sprintf("4. racing call %d", i+1), race, req) })
	}
	wg.Wait()
}
