package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idemgrpc "github.com/idemgo/idem/adapters/grpc"
	"github.com/idemgo/idem/adapters/grpc/internal/testpb"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
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

// TestNewValidates: New refuses a Config without an engine or a principal
// function, or with an unusable StoredMetadata key, naming the field.
func TestNewValidates(t *testing.T) {
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew()})
	if err != nil {
		t.Fatal(err)
	}
	principal := func(context.Context) (string, error) { return "alice", nil }
	for _, tc := range []struct {
		name string
		cfg  idemgrpc.Config
		want string // "" when New succeeds
	}{
		{"valid", idemgrpc.Config{Engine: eng, Principal: principal}, ""},
		{"no engine", idemgrpc.Config{Principal: principal}, "idemgrpc: idem: invalid config: Engine is required"},
		{"no principal function", idemgrpc.Config{Engine: eng}, "idemgrpc: idem: invalid config: Principal is required"},
		{"upper-case metadata key", idemgrpc.Config{Engine: eng, Principal: principal, StoredMetadata: []string{"X-Payment-Id"}}, "idemgrpc: idem: invalid config: StoredMetadata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i, err := idemgrpc.New(tc.cfg)
			if tc.want == "" {
				if err != nil || i == nil {
					t.Fatalf("New = %v", err)
				}
				return
			}
			if i != nil || !errors.Is(err, idem.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("New error %q, want ErrInvalidConfig starting %q", err, tc.want)
			}
		})
	}
}

// TestClassifyIsTheInterceptors: the interceptor classifies a method's
// outcome by its gRPC code with Config.Classify (DefaultClassifier), never
// with the engine's Config.Classify, which judges HTTP statuses for the
// HTTP middleware that shares the engine.
func TestClassifyIsTheInterceptors(t *testing.T) {
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(),
		Classify: func(status int, err error) idem.Disposition {
			t.Errorf("the engine's classifier was asked about status %d", status)
			return idem.Release
		}})
	if err != nil {
		t.Fatal(err)
	}
	var asked []codes.Code
	for _, tc := range []struct {
		name, key string
		classify  idem.Classifier
		code      codes.Code // what the method answers
		runs      int        // how often it runs for two calls
	}{
		{"default: OK is stored", "k-ok", nil, codes.OK, 1},
		{"default: Unavailable is released", "k-released", nil, codes.Unavailable, 2},
		{"own: Unavailable is stored", "k-own", func(status int, err error) idem.Disposition {
			asked = append(asked, codes.Code(status))
			return idem.Fail
		}, codes.Unavailable, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idempotent, err := idemgrpc.New(idemgrpc.Config{Engine: eng, Classify: tc.classify,
				Principal: func(context.Context) (string, error) { return "alice", nil }})
			if err != nil {
				t.Fatal(err)
			}
			runs := 0
			handler := func(ctx context.Context, req any) (any, error) {
				runs++
				if tc.code != codes.OK {
					return nil, status.Error(tc.code, "answered")
				}
				return &testpb.ActReply{}, nil
			}
			info := &grpc.UnaryServerInfo{FullMethod: testpb.TestService_Act_FullMethodName}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", tc.key))
			for range 2 {
				if _, err := idempotent(ctx, &testpb.ActRequest{EffectId: "pay_1"}, info, handler); status.Code(err) != tc.code {
					t.Fatalf("call: %v, want %v", err, tc.code)
				}
			}
			if runs != tc.runs {
				t.Fatalf("the method ran %d times, want %d", runs, tc.runs)
			}
		})
	}
	if len(asked) != 1 || asked[0] != codes.Unavailable {
		t.Fatalf("Config.Classify was asked about %v, want [Unavailable]", asked)
	}
}

// TestReconcileTakeover: a claim whose holder died is taken over after its
// lease; Config.Reconcile settles it with Stored, the client gets that
// reply, and the method never runs.
func TestReconcileTakeover(t *testing.T) {
	store := memstore.MustNew()
	reconciled := &testpb.ActReply{EffectId: "pay_1", Attempt: "from the provider"}
	idempotent := aliceInterceptor(t, idem.Config{Store: store, RequestTimeout: 100 * time.Millisecond, StoreTimeout: 100 * time.Millisecond, Lease: 300 * time.Millisecond,
		Reconcile: func(context.Context, idem.Record) (*idem.Response, error) { return idemgrpc.Stored(reconciled, nil) }})
	req := &testpb.ActRequest{EffectId: "pay_1"}
	input, _ := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	// A holder that claimed and died.
	fp := idemadapter.Fingerprint(storetest.FingerprintKey, "", testpb.TestService_Act_FullMethodName, "alice", idemgrpc.Encoding, input, nil)
	if _, err := store.Claim(context.Background(), idemstore.ClaimRequest{Principal: "alice", Key: "k", Fingerprint: fp, Token: "dead",
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
	idempotent := aliceInterceptor(t, idem.Config{Store: memstore.MustNew(),
		Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) { routes = append(routes, ev.Route) })})
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

// TestWaitInFlight: a duplicate of a call in flight waits for it under the
// engine's bound for its method (idem.Config.RouteWaitInFlight, by full
// method name) and gets the stored reply; past the bound it gets Aborted.
func TestWaitInFlight(t *testing.T) {
	for _, tc := range []struct {
		name     string
		holdFor  time.Duration
		wantCode codes.Code
	}{
		{"settled within the bound", 100 * time.Millisecond, codes.OK},
		{"past the bound", 2 * time.Second, codes.Aborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const bound = 500 * time.Millisecond
			idempotent := aliceInterceptor(t, idem.Config{Store: memstore.MustNew(),
				RouteWaitInFlight: map[string]time.Duration{testpb.TestService_Act_FullMethodName: bound}})
			info := &grpc.UnaryServerInfo{FullMethod: testpb.TestService_Act_FullMethodName}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k-wait"))
			req := &testpb.ActRequest{EffectId: "pay_1"}
			var runs atomic.Int32
			inside, gate := make(chan struct{}), make(chan struct{})
			handler := func(ctx context.Context, req any) (any, error) {
				if runs.Add(1) == 1 {
					close(inside)
					<-gate
				}
				return &testpb.ActReply{EffectId: "pay_1", Attempt: "first"}, nil
			}
			firstc := make(chan any, 1)
			go func() {
				got, _ := idempotent(ctx, req, info, handler)
				firstc <- got
			}()
			<-inside
			time.AfterFunc(tc.holdFor, func() { close(gate) })
			start := time.Now()
			got, err := idempotent(ctx, req, info, handler)
			took := time.Since(start)
			first := <-firstc
			switch {
			case status.Code(err) != tc.wantCode:
				t.Fatalf("the waiting duplicate: %v after %v, want %v", err, took, tc.wantCode)
			case tc.wantCode == codes.OK && !proto.Equal(got.(proto.Message), first.(proto.Message)):
				t.Fatalf("the waiting duplicate got %v, want the stored %v", got, first)
			case tc.wantCode == codes.Aborted && (took < bound || took > tc.holdFor):
				t.Fatalf("Aborted after %v, want at the bound %v", took, bound)
			case runs.Load() != 1:
				t.Fatalf("the handler ran %d times", runs.Load())
			}
		})
	}
}

// aliceInterceptor returns the interceptor of an engine on cfg (with the
// suite's fingerprint key) whose every call is alice's.
func aliceInterceptor(t *testing.T, cfg idem.Config) grpc.UnaryServerInterceptor {
	t.Helper()
	cfg.FingerprintKey = storetest.FingerprintKey
	eng, err := idem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	idempotent, err := idemgrpc.New(idemgrpc.Config{
		Engine:    eng,
		Principal: func(context.Context) (string, error) { return "alice", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return idempotent
}
