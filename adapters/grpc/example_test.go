package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	idemgrpc "github.com/idemgo/idem/adapters/grpc"
	"github.com/idemgo/idem/adapters/grpc/internal/testpb"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

type accountKey struct{}

// auth is the application's auth interceptor: the bearer token is the
// account (a real one verifies it).
func auth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 && len(v[0]) > len("Bearer ") {
		ctx = context.WithValue(ctx, accountKey{}, v[0][len("Bearer "):])
	}
	return handler(ctx, req)
}

type payments struct {
	testpb.UnimplementedTestServiceServer
	charges int
}

// Act charges once per call that runs; with a real store it writes
// through idempgx.Tx(ctx) or idemgorm.Tx(ctx).
func (p *payments) Act(ctx context.Context, r *testpb.ActRequest) (*testpb.ActReply, error) {
	p.charges++
	return &testpb.ActReply{EffectId: r.EffectId, Attempt: fmt.Sprint("charge ", p.charges)}, nil
}

// Example chains idemgrpc after authentication and calls one method twice
// with the same key: the second call is a replay, and another request under
// that key is refused.
func Example() {
	idempotent, err := idemgrpc.New(idemgrpc.Config{
		Config: idem.Config{FingerprintKey: fingerprintKey, Store: memstore.New()},
		Principal: func(ctx context.Context) (string, error) {
			account, _ := ctx.Value(accountKey{}).(string)
			return account, nil
		},
	})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, idempotent))
	svc := &payments{}
	testpb.RegisterTestServiceServer(srv, svc)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	client := testpb.NewTestServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		"authorization", "Bearer acct_1", "idempotency-key", "7f3a")

	for range 2 {
		var header metadata.MD
		reply, err := client.Act(ctx, &testpb.ActRequest{EffectId: "pay_1"}, grpc.Header(&header))
		fmt.Println(reply.GetAttempt(), err, header.Get(idemgrpc.ReplayedKey))
	}
	_, err = client.Act(ctx, &testpb.ActRequest{EffectId: "pay_2"})
	fmt.Println(status.Code(err) == codes.FailedPrecondition, "charges:", svc.charges)
	// Output:
	// charge 1 <nil> []
	// charge 1 <nil> [true]
	// true charges: 1
}

// fingerprintKey stands for the service's idem.Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance.
var fingerprintKey = []byte("example only: read yours from a secret store")
