package idemgrpc_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"testing"

	idemgrpc "github.com/idemgo/idem/adapters/grpc"
	"github.com/idemgo/idem/adapters/grpc/internal/testpb"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// echoServer answers Act without writing anything: the benchmarks measure
// the interceptor, not a handler.
type echoServer struct {
	testpb.UnimplementedTestServiceServer
}

func (echoServer) Act(_ context.Context, r *testpb.ActRequest) (*testpb.ActReply, error) {
	return &testpb.ActReply{EffectId: r.EffectId, Attempt: "1"}, nil
}

func benchInterceptor(b *testing.B) grpc.UnaryServerInterceptor {
	b.Helper()
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: adaptertest.BenchStore(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	i, err := idemgrpc.New(idemgrpc.Config{
		Engine:    eng,
		Principal: func(context.Context) (string, error) { return "acct_1", nil },
	})
	if err != nil {
		b.Fatal(err)
	}
	return i
}

// BenchmarkInterceptor measures idemgrpc over a real loopback connection
// next to the same server without it (Bare): a first call under a new key
// each time, and a replay of one key.
func BenchmarkInterceptor(b *testing.B) {
	for _, bc := range []struct {
		name   string
		idem   bool
		replay bool
	}{{"Bare", false, false}, {"FirstCall", true, false}, {"Replay", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			var opts []grpc.ServerOption
			if bc.idem {
				opts = append(opts, grpc.UnaryInterceptor(benchInterceptor(b)))
			}
			srv := grpc.NewServer(opts...)
			testpb.RegisterTestServiceServer(srv, echoServer{})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = srv.Serve(ln) }()
			defer srv.Stop()
			conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			client := testpb.NewTestServiceClient(conn)
			req := &testpb.ActRequest{EffectId: "pay_1"}
			call := func(key string) {
				ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key)
				if _, err := client.Act(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			call("replayed") // the connection is up and the replayed key stored
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; b.Loop(); n++ {
				if bc.replay {
					call("replayed")
				} else {
					call("k" + strconv.Itoa(n))
				}
			}
		})
	}
}

// BenchmarkInterceptorInProcess calls the interceptor function directly,
// without a connection, to show its own cost: the proto encoding of the
// request and reply, the metadata recorder and the engine with memstore.
// FirstCallOnNewGoroutine runs each first call on a goroutine of its own,
// as grpc-go's server runs each call: what a fresh goroutine's small stack
// costs the interceptor (the handoff itself is about half a microsecond).
func BenchmarkInterceptorInProcess(b *testing.B) {
	info := &grpc.UnaryServerInfo{FullMethod: testpb.TestService_Act_FullMethodName}
	handler := func(ctx context.Context, req any) (any, error) {
		return echoServer{}.Act(ctx, req.(*testpb.ActRequest))
	}
	req := &testpb.ActRequest{EffectId: "pay_1"}
	for _, bc := range []struct {
		name                 string
		replay, ownGoroutine bool
	}{{"FirstCall", false, false}, {"Replay", true, false}, {"FirstCallOnNewGoroutine", false, true}} {
		b.Run(bc.name, func(b *testing.B) {
			intercept := benchInterceptor(b)
			call := func(n int) error {
				key := "replayed"
				if !bc.replay {
					key = "k" + strconv.Itoa(n)
				}
				ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", key))
				_, err := intercept(ctx, req, info, handler)
				return err
			}
			errs := make(chan error)
			b.ReportAllocs()
			for n := 0; b.Loop(); n++ {
				var err error
				if bc.ownGoroutine {
					go func() { errs <- call(n) }()
					err = <-errs
				} else {
					err = call(n)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
