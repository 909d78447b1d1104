package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

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

// Example is a service's main, on memstore: the store, one engine, the
// interceptor after authentication, the sweeper, an observer and a
// graceful shutdown. The comments say what production uses instead. The
// second call with the key is a replay, and another request under that
// key is refused.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// With PostgreSQL: store, err := idempgx.New(pool), then
	// store.Migrate(ctx), or store.Check(ctx) when your migration tool
	// applies idempgx's migration. memstore has nothing to migrate.
	store := memstore.MustNew()

	// One engine for the process: the interceptor, every HTTP middleware,
	// the Sweeper and Engine.Do share it. New checks the store: one
	// without its table fails here, not at the first call.
	eng, err := idem.New(idem.Config{
		Store:          store,
		FingerprintKey: fingerprintKey,
		// In production: idemprom.New(prometheus.DefaultRegisterer, idemprom.Options{}),
		// or Logger: slog.Default() for one line per call.
		Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) { fmt.Println("observed:", ev.Outcome, ev.Route) }),
	})
	if err != nil {
		log.Fatal(err)
	}
	idempotent, err := idemgrpc.New(idemgrpc.Config{
		Engine: eng,
		Principal: func(ctx context.Context) (string, error) {
			account, _ := ctx.Value(accountKey{}).(string) // what auth left in the context
			return account, nil
		},
		Idempotent: func(m string) bool { return m == testpb.TestService_Act_FullMethodName },
	})
	if err != nil {
		log.Fatal(err)
	}

	// Only the sweeper deletes expired records and resolves the stale
	// claims no client retries.
	sweeper := &idem.Sweeper{Engine: eng}
	swept := make(chan error, 1)
	go func() { swept <- sweeper.Run(ctx) }()

	// After authentication: keys are claimed per principal, which auth
	// leaves in the context; before it, every call would be
	// Unauthenticated.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, idempotent))
	svc := &payments{}
	testpb.RegisterTestServiceServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // in production: your port
	if err != nil {
		log.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	client := testpb.NewTestServiceClient(conn)
	callCtx := metadata.AppendToOutgoingContext(context.Background(),
		"authorization", "Bearer acct_1", "idempotency-key", "7f3a")
	for range 2 { // a client and its retry
		var header metadata.MD
		reply, err := client.Act(callCtx, &testpb.ActRequest{EffectId: "pay_1"}, grpc.Header(&header))
		fmt.Println(reply.GetAttempt(), err, header.Get(idemgrpc.ReplayedKey))
	}
	_, err = client.Act(callCtx, &testpb.ActRequest{EffectId: "pay_2"})
	fmt.Println(status.Code(err) == codes.FailedPrecondition, "charges:", svc.charges)
	_ = conn.Close()

	stop() // in production: SIGTERM
	<-ctx.Done()
	// Running calls get their RequestTimeout, then StoreTimeout to commit.
	c := eng.Config()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(c.RequestTimeout + c.StoreTimeout):
		srv.Stop()
	}
	fmt.Println(<-served, <-swept)
	// Output:
	// observed: claimed /idemgrpc.test.v1.TestService/Act
	// charge 1 <nil> []
	// observed: replayed /idemgrpc.test.v1.TestService/Act
	// charge 1 <nil> [true]
	// observed: fingerprint_mismatch /idemgrpc.test.v1.TestService/Act
	// true charges: 1
	// <nil> context canceled
}

// fingerprintKey stands for the service's idem.Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance (hex.DecodeString(os.Getenv("IDEM_FINGERPRINT_KEY"))).
var fingerprintKey = []byte("example only: read yours from a secret store")
