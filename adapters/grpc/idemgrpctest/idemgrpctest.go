// Package idemgrpctest is the conformance suite of the gRPC interceptor:
// Run serves a generated test service behind an auth interceptor and
// idemgrpc on a real listener on 127.0.0.1, with a store from the given
// Backend, and drives it with a real gRPC client. idemgrpc's own tests run
// it on memstore; the conformance module runs it on every real store.
package idemgrpctest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idemgrpc "github.com/idemgo/idem/adapters/grpc"
	"github.com/idemgo/idem/adapters/grpc/internal/testpb"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Run runs the suite with stores from newBackend.
func Run(t *testing.T, newBackend storetest.NewBackend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s *suite)
	}{
		{"FirstThenReplay", testFirstThenReplay},
		{"ConcurrentRunOnce", testConcurrentRunOnce},
		{"WaitInFlight", testWaitInFlight},
		{"OtherRequestRefused", testOtherRequestRefused},
		{"NoPrincipal", testNoPrincipal},
		{"Keys", testKeys},
		{"AmbiguousKeysRefused", testAmbiguousKeys},
		{"DeterministicErrorStored", testDeterministicErrorStored},
		{"TransientCodesReleased", testTransientCodesReleased},
		{"PanicReleased", testPanicReleased},
		{"DeadlineReleases", testDeadlineReleases},
		{"FailedCommit", testFailedCommit},
		{"ReplyTooLarge", testReplyTooLarge},
		{"StoreUnavailable", testStoreUnavailable},
		{"OptionalKeyAndFilter", testOptionalKeyAndFilter},
		{"PrincipalsIsolated", testPrincipalsIsolated},
		{"ReplayReauthorized", testReplayReauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, &suite{b: newBackend(t)})
		})
	}
}

type suite struct{ b storetest.Backend }

type principalKey struct{}

// authenticate is the auth interceptor that runs before idemgrpc: it takes
// the principal from "authorization: Bearer <principal>" and refuses a call
// without one, as an application's would.
func authenticate(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 {
		if p, ok := strings.CutPrefix(v[0], "Bearer "); ok && p != "" {
			ctx = context.WithValue(ctx, principalKey{}, p)
		}
	}
	return handler(ctx, req)
}

// recovery turns a panic into Internal, as grpc-ecosystem's recovery
// interceptor does; it runs outermost.
func recovery(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return handler(ctx, req)
}

// server is the test service: Act writes one effect through the store's
// transaction in its context, then answers as the request says.
type server struct {
	testpb.UnimplementedTestServiceServer
	b    storetest.Backend
	runs atomic.Int64
}

func (s *server) Act(ctx context.Context, r *testpb.ActRequest) (*testpb.ActReply, error) {
	s.runs.Add(1)
	if err := s.b.WriteEffect(ctx, r.EffectId); err != nil {
		return nil, status.Errorf(codes.Internal, "effect: %v", err)
	}
	if r.Poison {
		if err := s.b.PoisonTx(ctx); err != nil {
			return nil, status.Errorf(codes.Internal, "poison: %v", err)
		}
	}
	for k, v := range r.Header {
		if r.SendHeader {
			_ = grpc.SendHeader(ctx, metadata.Pairs(k, v))
		} else {
			_ = grpc.SetHeader(ctx, metadata.Pairs(k, v))
		}
	}
	for k, v := range r.Trailer {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(k, v))
	}
	if r.DelayMs > 0 {
		select {
		case <-time.After(time.Duration(r.DelayMs) * time.Millisecond):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if r.Panic {
		panic("handler panic after its effect")
	}
	if r.Code != 0 {
		st, _ := status.New(codes.Code(r.Code), r.Message).WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "note", Description: r.Message}},
		})
		return nil, st.Err()
	}
	return &testpb.ActReply{EffectId: r.EffectId, Attempt: randHex(8), Note: r.Note, Padding: make([]byte, r.ReplyBytes)}, nil
}

func (s *server) Echo(ctx context.Context, r *testpb.ActRequest) (*testpb.ActReply, error) {
	s.runs.Add(1)
	return &testpb.ActReply{Note: r.Note, Attempt: randHex(8)}, nil
}

// start serves the test service behind recovery, authentication and
// idemgrpc configured with cfg, on an engine configured with ec, and
// returns a client and the server.
func (s *suite) start(t *testing.T, ec idem.Config, cfg idemgrpc.Config) (testpb.TestServiceClient, *server) {
	t.Helper()
	if ec.Store == nil {
		ec.Store = s.b.Store
	}
	if ec.FingerprintKey == nil {
		ec.FingerprintKey = storetest.FingerprintKey
	}
	eng, err := idem.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Engine = eng
	if cfg.Principal == nil {
		cfg.Principal = func(ctx context.Context) (string, error) {
			p, _ := ctx.Value(principalKey{}).(string)
			return p, nil
		}
	}
	if cfg.StoredMetadata == nil {
		cfg.StoredMetadata = []string{"x-stored"}
	}
	idempotent, err := idemgrpc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &server{b: s.b}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(recovery, authenticate, idempotent))
	testpb.RegisterTestServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	return testpb.NewTestServiceClient(conn), srv
}

// answer is what one call got.
type answer struct {
	reply            *testpb.ActReply
	err              error
	header, trailer  metadata.MD
	code             codes.Code
	replayed         bool
	reason           string
	retryDelay       time.Duration
	retryDelayIsSet  bool
	fieldViolationOK bool
}

// call sends r to Act (or Echo) as principal with key ("" for none).
func call(t *testing.T, c testpb.TestServiceClient, principal, key string, r *testpb.ActRequest, extra ...string) answer {
	t.Helper()
	return callMethod(t, c.Act, principal, key, r, extra...)
}

func callMethod(t *testing.T, m func(context.Context, *testpb.ActRequest, ...grpc.CallOption) (*testpb.ActReply, error),
	principal, key string, r *testpb.ActRequest, extra ...string) answer {
	t.Helper()
	md := metadata.MD{}
	if principal != "" {
		md.Set("authorization", "Bearer "+principal)
	}
	if key != "" {
		md.Set("idempotency-key", key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		md.Append(extra[i], extra[i+1])
	}
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 20*time.Second)
	defer cancel()
	var a answer
	a.reply, a.err = m(ctx, r, grpc.Header(&a.header), grpc.Trailer(&a.trailer))
	st := status.Convert(a.err)
	a.code = st.Code()
	a.replayed = len(a.header.Get(idemgrpc.ReplayedKey)) == 1 && a.header.Get(idemgrpc.ReplayedKey)[0] == "true"
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.Domain == idemgrpc.ErrorDomain {
				a.reason = d.Reason
			}
		case *errdetails.BadRequest:
			a.fieldViolationOK = len(d.FieldViolations) == 1 && d.FieldViolations[0].Field == "note"
		}
	}
	a.retryDelay, a.retryDelayIsSet = idemgrpc.RetryDelay(a.err)
	return a
}

func (s *suite) effects(t *testing.T, id string) int {
	t.Helper()
	n, err := s.b.CountEffects(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func want(t *testing.T, what string, a answer, code codes.Code, replayed bool) {
	t.Helper()
	if a.code != code || a.replayed != replayed {
		t.Fatalf("%s: code %v (%v), replayed %v; want %v, replayed %v", what, a.code, a.err, a.replayed, code, replayed)
	}
}

// testFirstThenReplay: the first call runs and commits its effect with its
// reply; a retry gets the same reply, the allow-listed header and trailer
// metadata and idempotent-replayed, and the method does not run again.
func testFirstThenReplay(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{}, idemgrpc.Config{})
	id := randHex(8)
	req := &testpb.ActRequest{EffectId: id, Note: "hello",
		Header: map[string]string{"x-stored": "h1", "x-secret": "s1"}, Trailer: map[string]string{"x-stored": "t1"}}
	first := call(t, c, "alice", "k-"+id, req)
	want(t, "first", first, codes.OK, false)
	if first.header.Get("x-secret")[0] != "s1" || first.trailer.Get("x-stored")[0] != "t1" {
		t.Fatalf("first call's metadata: header %v trailer %v", first.header, first.trailer)
	}
	retry := call(t, c, "alice", "k-"+id, req)
	want(t, "retry", retry, codes.OK, true)
	if retry.reply.Attempt != first.reply.Attempt || retry.reply.Note != "hello" || retry.reply.EffectId != id {
		t.Fatalf("replayed reply %v, first %v", retry.reply, first.reply)
	}
	if got := retry.header.Get("x-stored"); len(got) != 1 || got[0] != "h1" {
		t.Fatalf("replayed header %v: want the allow-listed x-stored", retry.header)
	}
	if len(retry.header.Get("x-secret")) != 0 {
		t.Fatalf("replayed header %v carries metadata outside the allow-list", retry.header)
	}
	if got := retry.trailer.Get("x-stored"); len(got) != 1 || got[0] != "t1" {
		t.Fatalf("replayed trailer %v", retry.trailer)
	}
	if n := s.effects(t, id); n != 1 || srv.runs.Load() != 1 {
		t.Fatalf("effects %d, runs %d; want 1, 1", n, srv.runs.Load())
	}
}

// concurrently makes n calls of req as alice under key at once and returns
// their answers.
func concurrently(t *testing.T, c testpb.TestServiceClient, key string, req *testpb.ActRequest, n int) []answer {
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = call(t, c, "alice", key, req) })
	}
	wg.Wait()
	return answers
}

// testConcurrentRunOnce: calls racing on one key run the method once; the
// others get Aborted with a RetryInfo, and a retry afterwards the reply.
func testConcurrentRunOnce(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{}, idemgrpc.Config{})
	id := randHex(8)
	req := &testpb.ActRequest{EffectId: id, DelayMs: 300}
	const n = 8
	answers := concurrently(t, c, "k-"+id, req, n)
	ok := 0
	for _, a := range answers {
		switch a.code {
		case codes.OK:
			ok++
		case codes.Aborted:
			if a.reason != "KEY_IN_USE" || !a.retryDelayIsSet || a.retryDelay < time.Second {
				t.Fatalf("in progress: reason %q, retry delay %v (%v)", a.reason, a.retryDelay, a.retryDelayIsSet)
			}
		default:
			t.Fatalf("concurrent call: %v", a.err)
		}
	}
	if ok < 1 || s.effects(t, id) != 1 || srv.runs.Load() != 1 {
		t.Fatalf("%d OK, effects %d, runs %d; want ≥1, 1, 1", ok, s.effects(t, id), srv.runs.Load())
	}
	want(t, "after", call(t, c, "alice", "k-"+id, req), codes.OK, true)
}

// testOtherRequestRefused: the same key with another request, or on
// another method, is FailedPrecondition and runs nothing.
func testOtherRequestRefused(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{}, idemgrpc.Config{})
	id := randHex(8)
	want(t, "first", call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Note: "a"}), codes.OK, false)
	other := call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Note: "b"})
	want(t, "other request", other, codes.FailedPrecondition, false)
	if other.reason != "KEY_REUSED" {
		t.Fatalf("reason %q", other.reason)
	}
	want(t, "other method", callMethod(t, c.Echo, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Note: "a"}), codes.FailedPrecondition, false)
	if srv.runs.Load() != 1 || s.effects(t, id) != 1 {
		t.Fatalf("runs %d effects %d", srv.runs.Load(), s.effects(t, id))
	}
}

// testNoPrincipal: without a principal the call is Unauthenticated and
// nothing is claimed: the same key with a principal then runs.
func testNoPrincipal(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{}, idemgrpc.Config{})
	id := randHex(8)
	a := call(t, c, "", "k-"+id, &testpb.ActRequest{EffectId: id})
	want(t, "anonymous", a, codes.Unauthenticated, false)
	if srv.runs.Load() != 0 {
		t.Fatal("the method ran without a principal")
	}
	if _, err := s.b.Store.Get(context.Background(), "", "k-"+id); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("a record exists after an unauthenticated call: %v", err)
	}
	want(t, "authenticated", call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id}), codes.OK, false)
}

// testKeys: the key is validated as the HTTP header is: missing, invalid
// and doubled keys are InvalidArgument; the quoted form names the same key
// (testAmbiguousKeys has the other ambiguous forms).
func testKeys(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{}, idemgrpc.Config{})
	id := randHex(8)
	req := &testpb.ActRequest{EffectId: id}
	for _, tc := range []struct {
		name, key string
		extra     []string
		reason    string
	}{
		{"missing", "", nil, "KEY_MISSING"},
		{"invalid", "a b", nil, "KEY_INVALID"},
		{"too long", strings.Repeat("k", 256), nil, "KEY_INVALID"},
		{"two values", "k1", []string{"idempotency-key", "k2"}, "KEY_INVALID"},
	} {
		a := call(t, c, "alice", tc.key, req, tc.extra...)
		want(t, tc.name, a, codes.InvalidArgument, false)
		if a.reason != tc.reason {
			t.Fatalf("%s: reason %q, want %q", tc.name, a.reason, tc.reason)
		}
	}
	if srv.runs.Load() != 0 {
		t.Fatal("the method ran with a bad key")
	}
	want(t, "bare", call(t, c, "alice", "k-"+id, req), codes.OK, false)
	want(t, "quoted", call(t, c, "alice", `"k-`+id+`"`, req), codes.OK, true)
}

// testAmbiguousKeys: a key that does not name one key (several metadata
// values, a list, an Inner List, parameters) is InvalidArgument
// KEY_INVALID, whichever value or member the interceptor might have taken:
// the method does not run and no reading of the key is claimed.
func testAmbiguousKeys(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{}, idemgrpc.Config{})
	// The forms of the HTTP suite, each field line a metadata value.
	for _, tc := range adaptertest.AmbiguousKeys {
		t.Run(tc.Name, func(t *testing.T) {
			var extra []string
			for _, v := range tc.Lines {
				extra = append(extra, "idempotency-key", v)
			}
			runs := srv.runs.Load()
			a := call(t, c, "alice", "", &testpb.ActRequest{EffectId: randHex(8)}, extra...)
			want(t, fmt.Sprintf("key values %q", tc.Lines), a, codes.InvalidArgument, false)
			if a.reason != "KEY_INVALID" {
				t.Fatalf("key values %q: reason %q, want KEY_INVALID", tc.Lines, a.reason)
			}
			if srv.runs.Load() != runs {
				t.Fatalf("key values %q: the method ran", tc.Lines)
			}
			for _, key := range tc.Keys {
				if _, err := s.b.Store.Get(context.Background(), "alice", key); !errors.Is(err, idemstore.ErrNotFound) {
					t.Fatalf("key values %q: %q was claimed: %v", tc.Lines, key, err)
				}
			}
		})
	}
	// The same characters inside one sf-string are one key.
	want(t, "a quoted key holding , and ;", call(t, c, "alice", `"k-one,key;x=1"`, &testpb.ActRequest{EffectId: randHex(8)}), codes.OK, false)
	if _, err := s.b.Store.Get(context.Background(), "alice", "k-one,key;x=1"); err != nil {
		t.Fatalf("the quoted key was not stored as k-one,key;x=1: %v", err)
	}
}

// testDeterministicErrorStored: a deterministic error is stored as failed
// with the method's writes, and replayed with its message and details.
func testDeterministicErrorStored(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{}, idemgrpc.Config{})
	for _, code := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated} {
		id := randHex(8)
		req := &testpb.ActRequest{EffectId: id, Code: int32(code), Message: "bad " + code.String()}
		first := call(t, c, "alice", "k-"+id, req)
		want(t, code.String(), first, code, false)
		retry := call(t, c, "alice", "k-"+id, req)
		want(t, code.String()+" retry", retry, code, true)
		if status.Convert(retry.err).Message() != "bad "+code.String() || !retry.fieldViolationOK {
			t.Fatalf("%v: replayed %v, details kept %v", code, retry.err, retry.fieldViolationOK)
		}
		if n := s.effects(t, id); n != 1 {
			t.Fatalf("%v: effects %d, want 1 (stored with the failure)", code, n)
		}
	}
	if srv.runs.Load() != 8 {
		t.Fatalf("runs %d, want 8", srv.runs.Load())
	}
}

// testTransientCodesReleased: a transient code rolls the method's writes
// back and releases the key; the retry runs again.
func testTransientCodesReleased(t *testing.T, s *suite) {
	c, _ := s.start(t, idem.Config{}, idemgrpc.Config{})
	for _, code := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted,
		codes.Aborted, codes.Internal, codes.Unknown, codes.Canceled, codes.DataLoss} {
		id := randHex(8)
		want(t, code.String(), call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Code: int32(code), Message: "x"}), code, false)
		if !s.b.NoSharedTx {
			if n := s.effects(t, id); n != 0 {
				t.Fatalf("%v: effects %d after a released call, want 0", code, n)
			}
		}
		want(t, code.String()+" retry", call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id}), codes.OK, false)
	}
}

// testPanicReleased: a panicking method rolls back and releases; the panic
// reaches the recovery interceptor.
func testPanicReleased(t *testing.T, s *suite) {
	c, _ := s.start(t, idem.Config{}, idemgrpc.Config{})
	id := randHex(8)
	want(t, "panic", call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Panic: true}), codes.Internal, false)
	if !s.b.NoSharedTx && s.effects(t, id) != 0 {
		t.Fatal("the panicking call's effect committed")
	}
	want(t, "retry", call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Panic: true}), codes.Internal, false)
	want(t, "fixed", call(t, c, "alice", "k2-"+id, &testpb.ActRequest{EffectId: id}), codes.OK, false)
}

// testDeadlineReleases: a method past RequestTimeout is rolled back and
// answered DeadlineExceeded with a RetryInfo.
func testDeadlineReleases(t *testing.T, s *suite) {
	c, _ := s.start(t, idem.Config{RequestTimeout: 200 * time.Millisecond}, idemgrpc.Config{})
	id := randHex(8)
	a := call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, DelayMs: 5000})
	want(t, "slow", a, codes.DeadlineExceeded, false)
	if a.reason != "TIMEOUT" || !a.retryDelayIsSet {
		t.Fatalf("reason %q retry %v", a.reason, a.retryDelayIsSet)
	}
	if !s.b.NoSharedTx && s.effects(t, id) != 0 {
		t.Fatal("the timed-out call's effect committed")
	}
	want(t, "retry", call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, DelayMs: 5000}), codes.DeadlineExceeded, false)
}

// testFailedCommit: when the commit fails nothing is stored, the client
// gets Unavailable with a RetryInfo, and the retry runs again.
func testFailedCommit(t *testing.T, s *suite) {
	if s.b.PoisonTx == nil {
		t.Skip("not applicable: the store shares no transaction with the method")
	}
	c, _ := s.start(t, idem.Config{}, idemgrpc.Config{})
	id := randHex(8)
	a := call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Poison: true})
	want(t, "poisoned", a, codes.Unavailable, false)
	if a.reason != "COMMIT_FAILED" || !a.retryDelayIsSet {
		t.Fatalf("reason %q retry %v", a.reason, a.retryDelayIsSet)
	}
	if s.effects(t, id) != 0 {
		t.Fatal("the effect of a failed commit stands")
	}
	want(t, "retry", call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Poison: true}), codes.Unavailable, false)
	// Nothing the method sent reaches the client before the commit, not
	// even a header it sent with grpc.SendHeader.
	sent := call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, Poison: true, SendHeader: true,
		Header: map[string]string{"x-stored": "early"}})
	want(t, "sent header", sent, codes.Unavailable, false)
	if len(sent.header.Get("x-stored")) != 0 {
		t.Fatalf("a header sent before the failed commit reached the client: %v", sent.header)
	}
	// And after a commit it goes out with the reply, and is stored.
	id2 := randHex(8)
	req := &testpb.ActRequest{EffectId: id2, SendHeader: true, Header: map[string]string{"x-stored": "sent"}}
	for _, replayed := range []bool{false, true} {
		a := call(t, c, "alice", "k-"+id2, req)
		want(t, "sent header, committed", a, codes.OK, replayed)
		if got := a.header.Get("x-stored"); len(got) != 1 || got[0] != "sent" {
			t.Fatalf("replayed %v: header %v", replayed, a.header)
		}
	}
}

// testReplyTooLarge: a reply over MaxResponseBytes is rolled back and
// answered Internal.
func testReplyTooLarge(t *testing.T, s *suite) {
	c, _ := s.start(t, idem.Config{MaxResponseBytes: 1024}, idemgrpc.Config{})
	id := randHex(8)
	a := call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id, ReplyBytes: 4096})
	want(t, "large", a, codes.Internal, false)
	if a.reason != "RESPONSE_TOO_LARGE" {
		t.Fatalf("reason %q", a.reason)
	}
	if !s.b.NoSharedTx && s.effects(t, id) != 0 {
		t.Fatal("the effect of an unstorable reply stands")
	}
}

// downStore fails every claim as a store that cannot be reached.
type downStore struct{ idemstore.Store }

func (downStore) Claim(context.Context, idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	return idemstore.ClaimResult{}, idemstore.WrapStoreError("down", "claim", idemstore.ClassTransient, errors.New("connection refused"))
}

// testStoreUnavailable: a store that cannot be reached is Unavailable
// with a RetryInfo, and the method does not run.
func testStoreUnavailable(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{Store: downStore{s.b.Store}}, idemgrpc.Config{})
	a := call(t, c, "alice", "k", &testpb.ActRequest{EffectId: randHex(8)})
	want(t, "down", a, codes.Unavailable, false)
	if a.reason != "STORE_UNAVAILABLE" || !a.retryDelayIsSet || srv.runs.Load() != 0 {
		t.Fatalf("reason %q retry %v runs %d", a.reason, a.retryDelayIsSet, srv.runs.Load())
	}
	if strings.Contains(status.Convert(a.err).Message(), "connection refused") {
		t.Fatalf("the store's error leaked: %v", a.err)
	}
}

// testOptionalKeyAndFilter: with KeyOptional a call without a key runs
// without idempotency; a method Idempotent leaves out runs as if the
// interceptor were not there.
func testOptionalKeyAndFilter(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{KeyOptional: true},
		idemgrpc.Config{Idempotent: func(m string) bool { return m != testpb.TestService_Echo_FullMethodName }})
	for range 2 {
		want(t, "no key", callMethod(t, c.Echo, "alice", "", &testpb.ActRequest{Note: "x"}), codes.OK, false)
	}
	want(t, "filtered with a key", callMethod(t, c.Echo, "", "k", &testpb.ActRequest{Note: "x"}), codes.OK, false)
	want(t, "filtered with a key, again", callMethod(t, c.Echo, "", "k", &testpb.ActRequest{Note: "x"}), codes.OK, false)
	if srv.runs.Load() != 4 {
		t.Fatalf("runs %d, want 4", srv.runs.Load())
	}
	// Without a key Act has no transaction to write its effect in.
	want(t, "act without key", call(t, c, "alice", "", &testpb.ActRequest{EffectId: randHex(8)}), codes.Internal, false)
	// A key sent empty or blank is not a missing key: it is refused, and
	// the method does not run without idempotency.
	for _, blank := range []string{"", "   "} {
		before := srv.runs.Load()
		a := call(t, c, "alice", "", &testpb.ActRequest{EffectId: randHex(8)}, "idempotency-key", blank)
		want(t, fmt.Sprintf("key %q", blank), a, codes.InvalidArgument, false)
		if srv.runs.Load() != before {
			t.Fatalf("key %q: the method ran", blank)
		}
	}
}

// testPrincipalsIsolated: one key used by two principals names two records.
func testPrincipalsIsolated(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{}, idemgrpc.Config{})
	id := randHex(8)
	a := call(t, c, "alice", "shared-"+id, &testpb.ActRequest{EffectId: id + "a"})
	b := call(t, c, "bob", "shared-"+id, &testpb.ActRequest{EffectId: id + "b"})
	want(t, "alice", a, codes.OK, false)
	want(t, "bob", b, codes.OK, false)
	if a.reply.Attempt == b.reply.Attempt || srv.runs.Load() != 2 {
		t.Fatalf("bob got alice's reply (runs %d)", srv.runs.Load())
	}
}

// testReplayReauthorized: Config.AuthorizeReplay refusing a replay is
// PermissionDenied, and the method does not run again.
func testReplayReauthorized(t *testing.T, s *suite) {
	var revoked atomic.Bool
	c, srv := s.start(t, idem.Config{
		AuthorizeReplay: func(context.Context, string, idem.Record) error {
			if revoked.Load() {
				return errors.New("account closed")
			}
			return nil
		},
	}, idemgrpc.Config{})
	id := randHex(8)
	want(t, "first", call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id}), codes.OK, false)
	revoked.Store(true)
	a := call(t, c, "alice", "k-"+id, &testpb.ActRequest{EffectId: id})
	want(t, "revoked", a, codes.PermissionDenied, false)
	if a.reason != "REPLAY_FORBIDDEN" || srv.runs.Load() != 1 {
		t.Fatalf("reason %q, runs %d", a.reason, srv.runs.Load())
	}
}

// testWaitInFlight: with the engine's WaitInFlight, duplicates of a call
// in flight wait for it and get its reply replayed instead of Aborted;
// the method runs once.
func testWaitInFlight(t *testing.T, s *suite) {
	c, srv := s.start(t, idem.Config{WaitInFlight: 10 * time.Second}, idemgrpc.Config{})
	id := randHex(8)
	req := &testpb.ActRequest{EffectId: id, DelayMs: 500}
	const n = 6
	answers := concurrently(t, c, "k-"+id, req, n)
	var first *testpb.ActReply
	replayed := 0
	for _, a := range answers {
		if a.code != codes.OK {
			t.Fatalf("a waiting duplicate got %v, want OK", a.err)
		}
		if !a.replayed {
			first = a.reply
			continue
		}
		replayed++
	}
	if first == nil || replayed != n-1 {
		t.Fatalf("%d replayed of %d, want all but the first", replayed, n)
	}
	for i, a := range answers {
		if !proto.Equal(a.reply, first) {
			t.Fatalf("answer %d is %v, want the first call's %v", i, a.reply, first)
		}
	}
	if s.effects(t, id) != 1 || srv.runs.Load() != 1 {
		t.Fatalf("effects %d, runs %d; want 1, 1", s.effects(t, id), srv.runs.Load())
	}
}
