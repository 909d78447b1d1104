// Package idemgrpc is the idem interceptor for gRPC unary methods
// (google.golang.org/grpc): the client sends an idempotency-key metadata
// entry, the interceptor claims (principal, key) atomically, runs the
// method inside the store's transaction, stores its reply (or its
// deterministic error) together with the method's writes, and answers every
// retry with the stored result without running the method again.
//
// Build the engine once with idem.New and hand it to the interceptor, the
// HTTP middleware of the same service, the idem.Sweeper and anything
// calling Engine.Do. Chain the interceptor after authentication, which
// must leave the principal where Config.Principal finds it; a call without
// one is refused with Unauthenticated and nothing is claimed. A service's
// main, with PostgreSQL and Prometheus (Example runs the same on memstore):
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		defer stop()
//
//		pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		defer pool.Close()
//		store, err := idempgx.New(pool) // or idemgorm.New(db)
//		if err != nil {
//			log.Fatal(err)
//		}
//		// Migrate creates the table; when your migration tool applies the
//		// store's migration, call store.Check(ctx) instead.
//		if err := store.Migrate(ctx); err != nil {
//			log.Fatal(err)
//		}
//		// At least 32 random bytes (openssl rand -hex 32) from your secret
//		// store, the same on every instance.
//		key, err := hex.DecodeString(os.Getenv("IDEM_FINGERPRINT_KEY"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		metrics, err := idemprom.New(prometheus.DefaultRegisterer, idemprom.Options{})
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		// One engine for the process: every middleware and interceptor, the
//		// Sweeper and Engine.Do share it. New fails on an invalid Config or a
//		// store without its table.
//		eng, err := idem.New(idem.Config{Store: store, FingerprintKey: key, Observer: metrics})
//		if err != nil {
//			log.Fatal(err)
//		}
//		idempotent, err := idemgrpc.New(idemgrpc.Config{
//			Engine: eng,
//			Principal: func(ctx context.Context) (string, error) {
//				account, _ := ctx.Value(accountKey{}).(string) // what auth left in the context
//				return account, nil
//			},
//			Idempotent:     func(m string) bool { return m == paymentsv1.Payments_CreatePayment_FullMethodName },
//			StoredMetadata: []string{"x-payment-id"}, // header and trailer metadata kept for replays
//		})
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		// Only the sweeper deletes expired records and resolves the stale
//		// claims no client retries.
//		go (&idem.Sweeper{Engine: eng, Observer: metrics}).Run(ctx)
//
//		// After authentication: keys are claimed per principal, which auth
//		// leaves in the context; before it, every call is answered
//		// Unauthenticated.
//		srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recovery, auth, idempotent))
//		paymentsv1.RegisterPaymentsServer(srv, &payments{})
//		ln, err := net.Listen("tcp", ":9090")
//		if err != nil {
//			log.Fatal(err)
//		}
//		go func() {
//			if err := srv.Serve(ln); err != nil {
//				log.Fatal(err)
//			}
//		}()
//		<-ctx.Done()
//		// Running calls get their RequestTimeout, then StoreTimeout to commit.
//		c := eng.Config()
//		stopped := make(chan struct{})
//		go func() { srv.GracefulStop(); close(stopped) }()
//		select {
//		case <-stopped:
//		case <-time.After(c.RequestTimeout + c.StoreTimeout):
//			srv.Stop()
//		}
//	}
//
// Methods reach the store's transaction through their context with the
// store's accessor (idempgx.Tx(ctx), idemgorm.Tx(ctx)).
//
// # What is stored and replayed
//
// The fingerprint covers the full method name and the request message's
// deterministic proto encoding (proto.MarshalOptions{Deterministic: true}),
// so the same key with another request, or on another method, is refused.
// A reply is stored as its proto encoding with code OK; an error as its
// google.rpc.Status (code, message, details), together with the header
// and trailer metadata named in Config.StoredMetadata. A replay decodes
// the reply into the method's reply type, found in the proto registry from
// the method's name, and carries "idempotent-replayed: true" in its header.
//
// # Status codes
//
// The method's own outcome, by its code (DefaultClassifier):
//
//	OK                                                  stored as completed, replayed
//	InvalidArgument, NotFound, AlreadyExists,
//	PermissionDenied, FailedPrecondition, OutOfRange,
//	Unimplemented, Unauthenticated                      stored as failed, replayed
//	Unavailable, DeadlineExceeded, ResourceExhausted,
//	Aborted, Internal, Unknown, Canceled, DataLoss      released: rolled back, the retry runs again
//
// The interceptor's own answers (the HTTP status of the same case in
// brackets):
//
//	no principal (401)                                  Unauthenticated
//	principal, key or request unusable (400, 413)       InvalidArgument
//	key held by another attempt (409)                   Aborted, RetryInfo
//	key used with another request (422)                 FailedPrecondition
//	an earlier attempt's outcome unknown, no Reconcile
//	to ask: an operator must resolve the key (409)      FailedPrecondition
//	replay not authorised (403)                         PermissionDenied
//	store unavailable, commit failed (503, 500)         Unavailable, RetryInfo
//	method past idem.Config.RequestTimeout (503)        DeadlineExceeded, RetryInfo
//	lease lost to a takeover (409)                      Aborted, RetryInfo
//	principal past MaxInFlightPerPrincipal (429)        ResourceExhausted, RetryInfo
//	store misconfigured, reply too large,
//	transaction ended by the method (500)               Internal
//
// Each carries a google.rpc.ErrorInfo whose reason names the case
// (KEY_IN_USE, KEY_REUSED, …) in the domain "idem.idemgo.github.com".
// Another request under a used key is FailedPrecondition, not
// InvalidArgument: the request is valid on its own, and it is the state of
// the key, not the request, that refuses it (the gRPC definition of
// FailedPrecondition); a client must not retry it unchanged.
//
// The engine's Config.Reconcile settles a gRPC method's takeover with
// Stored(reply, err), the outcome in the form the interceptor stores. The
// Sweeper asks the same Reconcile about the stale claims no client
// retries, but settles its answer as an HTTP response (the engine's
// Config.Classify and StoredHeaders), in which form a gRPC method's reply
// does not replay. On an engine whose Reconcile answers gRPC methods, give
// the Sweeper the store and the lease rather than the engine
// (idem.Sweeper{Store: store, Lease: eng.Config().Lease}): it then purges
// and reports stale claims, and each client's retry reconciles its own
// through the interceptor.
//
// Only unary methods are covered: a stream cannot be stored and replayed.
package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ReplayedKey is the header metadata key set to "true" on every replay.
const ReplayedKey = "idempotent-replayed"

// Encoding names the fingerprinted encoding of a request message.
const Encoding = "application/protobuf"

// ErrorDomain is the domain of the google.rpc.ErrorInfo the interceptor's
// own errors carry.
const ErrorDomain = "idem.idemgo.github.com"

// Config configures the interceptor: the engine it runs on, how to read
// the authenticated principal, and which methods and metadata it covers.
//
// Of the engine's Config, Header and RequestIDHeader name the metadata keys
// (lower-cased: "idempotency-key", "x-request-id"); StoredHeaders is not
// used (see StoredMetadata), nor is Classify (see Classify), so the same
// engine serves the HTTP middleware and the interceptor.
type Config struct {
	// Engine runs the idempotency state machine. Required. Build it once
	// with idem.New and share it across every middleware and interceptor,
	// the idem.Sweeper and Engine.Do: the per-route hold times behind
	// Retry-After and the MaxInFlightPerPrincipal limit are the engine's
	// own, so a second engine over the same store keeps a second set.
	Engine *idem.Engine
	// Principal returns the authenticated caller, as the auth interceptor
	// before this one left it in ctx. An empty result or an error answers
	// Unauthenticated and claims nothing. Required.
	Principal func(ctx context.Context) (string, error)
	// Idempotent reports whether calls to fullMethod
	// ("/pkg.Service/Method") go through the interceptor; the others run
	// as if it were not there. Nil means every unary method.
	Idempotent func(fullMethod string) bool
	// StoredMetadata lists the header and trailer metadata keys that are
	// stored with the result and replayed (lower-case). The first call's
	// client gets all the metadata the method set; a replay only these.
	// Default none.
	StoredMetadata []string
	// Classify decides which outcomes of a method are stored: it receives
	// the method's gRPC code as its status (int(codes.Code)) and the
	// method's error. Default DefaultClassifier. The engine's
	// Config.Classify, which judges HTTP statuses, is not used.
	Classify idem.Classifier
}

// DefaultClassifier decides by gRPC code (status is int(codes.Code)): OK
// completes; the codes a retry would only repeat fail (stored and
// replayed); the transient ones are released so the retry runs again.
func DefaultClassifier(status int, _ error) idem.Disposition {
	switch codes.Code(status) {
	case codes.OK:
		return idem.Complete
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return idem.Fail
	}
	// Unavailable, DeadlineExceeded, ResourceExhausted, Aborted, Internal,
	// Unknown, Canceled, DataLoss and codes this package does not know.
	return idem.Release
}

// New returns the unary server interceptor running on cfg.Engine. It fails
// with an error wrapping idem.ErrInvalidConfig, naming the field, when
// Engine or Principal is nil or StoredMetadata names an unusable key.
func New(cfg Config) (grpc.UnaryServerInterceptor, error) {
	classify := cfg.Classify
	if classify == nil {
		classify = DefaultClassifier
	}
	a, err := idemadapter.NewAdapter("idemgrpc", cfg.Engine, cfg.Principal)
	if err != nil {
		return nil, err
	}
	stored := make(map[string]bool, len(cfg.StoredMetadata))
	for _, k := range cfg.StoredMetadata {
		if k == "" || k != strings.ToLower(k) || k == ReplayedKey {
			return nil, fmt.Errorf("idemgrpc: %w: StoredMetadata: %q is not a lower-case metadata key other than %s", idem.ErrInvalidConfig, k, ReplayedKey)
		}
		stored[k] = true
	}
	ec := a.Config()
	i := &interceptor{
		a: a, classify: classify, idempotent: cfg.Idempotent, stored: stored,
		keyMD: strings.ToLower(ec.Header), requestIDMD: strings.ToLower(ec.RequestIDHeader),
	}
	return i.intercept, nil
}

type interceptor struct {
	a                  *idemadapter.Adapter[context.Context]
	classify           idem.Classifier
	idempotent         func(string) bool
	stored             map[string]bool
	keyMD, requestIDMD string
	replyTypes         sync.Map // full method name → protoreflect.MessageType
}

// Stored metadata is kept in the record's header map under these prefixes.
const (
	headerPrefix  = "header:"
	trailerPrefix = "trailer:"
)

// intercept is the interceptor. Its own frame is small, so that growStack
// runs before the first growth of a new goroutine's stack.
func (i *interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if i.idempotent != nil && !i.idempotent(info.FullMethod) {
		return handler(ctx, req)
	}
	growStack()
	return i.call(ctx, req, info, handler)
}

// call runs one idempotent call through the engine.
func (i *interceptor) call(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	// Every value of the key: several are refused as ambiguous, and one
	// present but empty is refused as blank, never run without
	// idempotency (idemadapter.KeyField).
	key := idemadapter.KeyField(md.Get(i.keyMD))
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the request of %s is not a proto message", info.FullMethod)
	}
	input, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: encoding the request: %v", err)
	}
	principal, perr := i.a.Principal(ctx)
	var requestID string
	if v := md.Get(i.requestIDMD); len(v) > 0 {
		requestID = v[0]
	}

	// The method's metadata is held back until the outcome is committed,
	// as an HTTP response is buffered.
	rec := &recorder{method: info.FullMethod}
	hctx := grpc.NewContextWithServerTransportStream(ctx, rec)
	var (
		ran   bool
		reply any
		herr  error
	)
	res, err := i.a.Do(hctx, idem.Call{
		Principal: principal, PrincipalErr: perr, Key: key, Operation: info.FullMethod, Route: info.FullMethod,
		Encoding: Encoding, Input: input, RequestID: requestID, Classify: i.classify,
	}, func(ctx context.Context) (idem.Response, error) {
		ran = true
		reply, herr = handler(ctx, req)
		return i.response(reply, herr, rec)
	})
	var ce *idem.CallError
	switch {
	case errors.As(err, &ce):
		return nil, i.problemStatus(ce).Err()
	case ran:
		// Stored, released or run without a key: the method's own answer
		// and metadata.
		rec.forward(ctx)
		return reply, herr
	}
	// A replay, or the outcome the engine's Reconcile settled a takeover
	// with.
	out := metadata.MD{}
	for k, v := range res.Header {
		switch {
		case strings.HasPrefix(k, headerPrefix):
			out[strings.TrimPrefix(k, headerPrefix)] = v
		case strings.HasPrefix(k, trailerPrefix):
			_ = grpc.SetTrailer(ctx, metadata.MD{strings.TrimPrefix(k, trailerPrefix): v})
		}
	}
	if res.Replayed {
		out.Set(ReplayedKey, "true")
	}
	if len(out) > 0 {
		_ = grpc.SetHeader(ctx, out)
	}
	return i.decode(info.FullMethod, res.Response)
}

// response is the stored form of the method's outcome: the reply's proto
// encoding with code OK, or the error's google.rpc.Status with its code,
// and the allow-listed metadata.
func (i *interceptor) response(reply any, herr error, rec *recorder) (idem.Response, error) {
	resp := idem.Response{Header: rec.stored(i.stored)}
	if herr != nil {
		st := status.Convert(herr)
		body, err := proto.Marshal(st.Proto())
		if err != nil {
			return idem.Response{Status: int(codes.Internal)}, herr
		}
		resp.Status, resp.Body = int(st.Code()), body
		return resp, herr
	}
	msg, ok := reply.(proto.Message)
	if !ok {
		herr = status.Errorf(codes.Internal, "idemgrpc: the reply is not a proto message (%T)", reply)
		return idem.Response{Status: int(codes.Internal)}, herr
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return idem.Response{Status: int(codes.Internal)}, status.Errorf(codes.Internal, "idemgrpc: encoding the reply: %v", err)
	}
	resp.Body = body
	return resp, nil
}

// Stored returns the outcome of a method as idemgrpc stores it: reply's
// proto encoding with code OK, or err's google.rpc.Status with its code.
// The engine's Config.Reconcile returns it to settle a gRPC method's
// takeover with what the crashed attempt's effect became (its reply, or
// the error its outcome should replay as).
func Stored(reply proto.Message, err error) (*idem.Response, error) {
	resp, rerr := (&interceptor{}).response(reply, err, &recorder{})
	if err == nil && rerr != nil {
		return nil, rerr
	}
	return &resp, nil
}

// decode turns a stored outcome back into the method's reply or error.
func (i *interceptor) decode(fullMethod string, r idem.Response) (any, error) {
	if codes.Code(r.Status) != codes.OK {
		st := &spb.Status{}
		if err := proto.Unmarshal(r.Body, st); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: the stored error of %s cannot be decoded", fullMethod)
		}
		return nil, status.ErrorProto(st)
	}
	mt, err := i.replyType(fullMethod)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: %v", err)
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(r.Body, msg); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the stored reply of %s cannot be decoded", fullMethod)
	}
	return msg, nil
}

// replyType finds the reply type of fullMethod ("/pkg.Service/Method") in
// the global proto registry, where the generated code of every compiled
// service registers it.
func (i *interceptor) replyType(fullMethod string) (protoreflect.MessageType, error) {
	if mt, ok := i.replyTypes.Load(fullMethod); ok {
		return mt.(protoreflect.MessageType), nil
	}
	name := protoreflect.FullName(strings.ReplaceAll(strings.TrimPrefix(fullMethod, "/"), "/", "."))
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
	if err != nil {
		return nil, fmt.Errorf("method %s is not in the proto registry: %w", fullMethod, err)
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is not a method", name)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("reply type of %s: %w", fullMethod, err)
	}
	i.replyTypes.Store(fullMethod, mt)
	return mt, nil
}

// codeOf maps the library's own answers to gRPC codes (see the package
// documentation for the table).
var codeOf = map[idem.ProblemType]codes.Code{
	idem.ProblemUnauthenticated:  codes.Unauthenticated,
	idem.ProblemPrincipalInvalid: codes.InvalidArgument,
	idem.ProblemKeyMissing:       codes.InvalidArgument,
	idem.ProblemKeyInvalid:       codes.InvalidArgument,
	idem.ProblemBodyTooLarge:     codes.InvalidArgument,
	idem.ProblemBodyUnreadable:   codes.InvalidArgument,
	idem.ProblemKeyInUse:         codes.Aborted,
	idem.ProblemKeyReused:        codes.FailedPrecondition,
	idem.ProblemForbidden:        codes.PermissionDenied,
	idem.ProblemStoreUnavailable: codes.Unavailable,
	idem.ProblemCommitFailed:     codes.Unavailable,
	idem.ProblemTimeout:          codes.DeadlineExceeded,
	idem.ProblemLeaseLost:        codes.Aborted,
	idem.ProblemMisconfigured:    codes.Internal,
	idem.ProblemResponseTooLarge: codes.Internal,
	idem.ProblemTxEnded:          codes.Internal,
	idem.ProblemTooManyInFlight:  codes.ResourceExhausted,
	idem.ProblemReplayUnreadable: codes.Internal,
	idem.ProblemOutcomeUnknown:   codes.FailedPrecondition,
}

// Code returns the gRPC code the interceptor answers the library's case p
// with.
func Code(p idem.ProblemType) codes.Code {
	if c, ok := codeOf[p]; ok {
		return c
	}
	return codes.Internal
}

// problemStatus renders a CallError as a status: the case's code, the
// problem's title (never the cause: no SQL, no other principal's data),
// an ErrorInfo naming the case and, when a retry can succeed later, a
// RetryInfo.
func (i *interceptor) problemStatus(ce *idem.CallError) *status.Status {
	p := idem.NewProblem(ce.Problem)
	st := status.New(Code(ce.Problem), p.Title)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{
		Reason: reason(ce.Problem), Domain: ErrorDomain,
		Metadata: map[string]string{"problem_type": string(ce.Problem)},
	}}
	if ce.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(ce.RetryAfter)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		return withDetails
	}
	return st
}

// reason is the ErrorInfo reason of p: its fragment in upper snake case
// (key-in-use → KEY_IN_USE).
func reason(p idem.ProblemType) string {
	frag := strings.TrimPrefix(string(p), idem.ProblemTypeBase)
	return strings.ToUpper(strings.ReplaceAll(frag, "-", "_"))
}

// RetryDelay returns the RetryInfo delay an error from the interceptor
// carries, for clients.
func RetryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// recorder stands in for the call's transport stream while the method runs:
// it keeps the header and trailer metadata the method sets (SendHeader
// included), so nothing reaches the client before the commit.
type recorder struct {
	method string

	mu              sync.Mutex
	header, trailer metadata.MD
}

func (r *recorder) Method() string { return r.method }

func (r *recorder) SetHeader(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.header = metadata.Join(r.header, md)
	return nil
}

// SendHeader keeps md like SetHeader: the header goes out with the reply,
// after the commit.
func (r *recorder) SendHeader(md metadata.MD) error { return r.SetHeader(md) }

func (r *recorder) SetTrailer(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trailer = metadata.Join(r.trailer, md)
	return nil
}

// stored returns the allow-listed metadata in the record's header form.
func (r *recorder) stored(allow map[string]bool) map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out map[string][]string
	add := func(prefix string, md metadata.MD) {
		for k, v := range md {
			if allow[k] {
				if out == nil {
					out = make(map[string][]string)
				}
				out[prefix+k] = append([]string(nil), v...)
			}
		}
	}
	add(headerPrefix, r.header)
	add(trailerPrefix, r.trailer)
	return out
}

// forward sends what the method set to the real stream of ctx.
func (r *recorder) forward(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.header) > 0 {
		_ = grpc.SetHeader(ctx, r.header)
	}
	if len(r.trailer) > 0 {
		_ = grpc.SetTrailer(ctx, r.trailer)
	}
}

// growStack grows the calling goroutine's stack to 16 KiB, about what the
// engine's calls need, while the stack is still shallow. grpc-go's server
// runs each call on a new goroutine, whose small stack would otherwise
// grow two or three times under the engine, each time copying every frame
// below (docs/design-notes.md, "The engine's hot path"). On a goroutine
// whose stack is already that large it costs the clearing of the frame.
//
//go:noinline
func growStack() {
	var frame [10 << 10]byte
	keep(frame[:])
}

// keep takes the frame, so that the compiler keeps it.
//
//go:noinline
func keep([]byte) {}
