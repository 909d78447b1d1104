package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	idemgrpc "github.com/idemgo/idem/adapters/grpc"
	"github.com/idemgo/idem/adapters/grpc/internal/testpb"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem/adapters/grpc/idemgrpctest"
	"github.com/idemgo/idem/core/storetest"
)

// TestSuite runs the gRPC suite on memstore; conformance runs it on every
// real store.
func TestSuite(t *testing.T) {
	idemgrpctest.Run(t, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}

// TestReconcileTakeover: a claim whose holder died is taken over after its
// lease; Config.Reconcile settles it with Stored, the client gets that
// reply, and the method never runs.
func TestReconcileTakeover(t *testing.T) {
	store := memstore.New()
	reconciled := &testpb.ActReply{EffectId: "pay_1", Attempt: "from the provider"}
	idempotent, err := idemgrpc.New(idemgrpc.Config{
		Config: idem.Config{Store: store, RequestTimeout: 100 * time.Millisecond, StoreTimeout: 100 * time.Millisecond, Lease: 300 * time.Millisecond,
			Reconcile: func(context.Context, idem.Record) (*idem.Response, error) { return idemgrpc.Stored(reconciled, nil) }},
		Principal: func(context.Context) (string, error) { return "alice", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	req := &testpb.ActRequest{EffectId: "pay_1"}
	input, _ := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	// A holder that claimed and died.
	fp := idem.Fingerprint("", testpb.TestService_Act_FullMethodName, "alice", idemgrpc.Encoding, input, nil)
	if _, err := store.Claim(context.Background(), idem.ClaimRequest{Principal: "alice", Key: "k", Fingerprint: fp, Token: "dead",
		Lease: 300 * time.Millisecond, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	ran := 0
	handler := func(ctx context.Context, req any) (any, error) { ran++; return &testpb.ActReply{}, nil }
	info := &grpc.UnaryServerInfo{FullMethod: testpb.TestService_Act_FullMethodName}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k"))
	if _, err := idempotent(ctx, req, info, handler); status.Code(err) != codes.Aborted {
		t.Fatalf("while the dead holder's lease runs: %v, want Aborted", err)
	}
	time.Sleep(350 * time.Millisecond)
	for i := range 2 {
		got, err := idempotent(ctx, req, info, handler)
		if err != nil || !proto.Equal(got.(proto.Message), reconciled) || ran != 0 {
			t.Fatalf("call %d after the lease: %v, %v, handler ran %d times", i+1, got, err, ran)
		}
	}
}

// TestEventRouteIsTheFullMethod: per-route metrics label a gRPC call by its
// full method name, a bounded set, never by anything the client sent.
func TestEventRouteIsTheFullMethod(t *testing.T) {
	var routes []string
	idempotent, err := idemgrpc.New(idemgrpc.Config{
		Config: idem.Config{Store: memstore.New(),
			Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) { routes = append(routes, ev.Route) })},
		Principal: func(context.Context) (string, error) { return "alice", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	info := &grpc.UnaryServerInfo{FullMethod: testpb.TestService_Act_FullMethodName}
	handler := func(ctx context.Context, req any) (any, error) { return &testpb.ActReply{}, nil }
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k-route"))
	for range 2 { // the run and its replay
		if _, err := idempotent(ctx, &testpb.ActRequest{EffectId: "pay_1"}, info, handler); err != nil {
			t.Fatal(err)
		}
	}
	if len(routes) != 2 || routes[0] != info.FullMethod || routes[1] != info.FullMethod {
		t.Fatalf("routes %q, want %s twice", routes, info.FullMethod)
	}
}
