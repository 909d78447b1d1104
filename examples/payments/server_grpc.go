package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	idemgrpc "github.com/idemgo/idem/adapters/grpc"
	"github.com/idemgo/idem/examples/payments/paymentsv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The gRPC API (-grpc-addr): payments.v1.Payments on the same Service and
// store as the HTTP API, behind recovery → bearer-token authentication →
// idemgrpc (CreatePayment only).

type accountCtxKey struct{}

// grpcAuth takes the account from "authorization: Bearer <account>"
// metadata, the same accounts as the HTTP API, and refuses a call without
// one with Unauthenticated.
func grpcAuth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	account := ""
	if v := md.Get("authorization"); len(v) == 1 {
		account = Authenticate(v[0])
	}
	if account == "" {
		return nil, status.Error(codes.Unauthenticated, "send authorization: Bearer <account>, where <account> is 1 to 64 of a-z, 0-9, _ and -")
	}
	return handler(context.WithValue(ctx, accountCtxKey{}, account), req)
}

// grpcRecovery answers a panic with Internal; idemgrpc has rolled back and
// released the key before the panic got here.
func grpcRecovery(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				log.ErrorContext(ctx, "handler panicked", slog.Any("panic", v), slog.String("method", info.FullMethod))
				err = status.Error(codes.Internal, "the call failed and was rolled back; retrying with the same key is safe")
			}
		}()
		return handler(ctx, req)
	}
}

// newGRPCServer mounts the Payments service on the app's engine, the one
// the HTTP middleware and the sweeper use.
func newGRPCServer(a *app) (*grpc.Server, error) {
	idempotent, err := idemgrpc.New(idemgrpc.Config{
		Engine: a.engine,
		Principal: func(ctx context.Context) (string, error) {
			account, _ := ctx.Value(accountCtxKey{}).(string)
			return account, nil
		},
		Idempotent: func(m string) bool { return m == paymentsv1.Payments_CreatePayment_FullMethodName },
	})
	if err != nil {
		return nil, err
	}
	s := grpc.NewServer(append(grpcLimits(), grpc.ChainUnaryInterceptor(grpcRecovery(a.log), grpcAuth, idempotent))...)
	paymentsv1.RegisterPaymentsServer(s, &grpcPayments{svc: a.svc})
	return s, nil
}

type grpcPayments struct {
	paymentsv1.UnimplementedPaymentsServer
	svc *Service
}

// CreatePayment runs the HTTP API's Service.Create with the request as its
// JSON body; ctx carries the idempotency transaction.
func (g *grpcPayments) CreatePayment(ctx context.Context, r *paymentsv1.CreatePaymentRequest) (*paymentsv1.Payment, error) {
	account, _ := ctx.Value(accountCtxKey{}).(string)
	body, _ := json.Marshal(map[string]any{"amount": r.Amount, "currency": r.Currency, "description": r.Description})
	simulate := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("x-simulate-failure"); len(v) > 0 {
			simulate = v[0]
		}
	}
	reply := g.svc.Create(ctx, account, body, simulate)
	if reply.Status != http.StatusCreated {
		return nil, replyStatus(reply)
	}
	var p Payment
	if err := json.Unmarshal(reply.Body, &p); err != nil {
		return nil, status.Error(codes.Internal, "payment not rendered")
	}
	return toProto(p), nil
}

// ListPayments lists the caller's payments.
func (g *grpcPayments) ListPayments(ctx context.Context, _ *paymentsv1.ListPaymentsRequest) (*paymentsv1.ListPaymentsResponse, error) {
	account, _ := ctx.Value(accountCtxKey{}).(string)
	reply := g.svc.List(ctx, account)
	if reply.Status != http.StatusOK {
		return nil, replyStatus(reply)
	}
	var list struct {
		Payments []Payment `json:"payments"`
	}
	if err := json.Unmarshal(reply.Body, &list); err != nil {
		return nil, status.Error(codes.Internal, "payments not rendered")
	}
	out := &paymentsv1.ListPaymentsResponse{}
	for _, p := range list.Payments {
		out.Payments = append(out.Payments, toProto(p))
	}
	return out, nil
}

func toProto(p Payment) *paymentsv1.Payment {
	return &paymentsv1.Payment{Id: p.ID, Amount: p.Amount, Currency: p.Currency, Description: p.Description,
		Status: p.Status, CreatedAt: p.CreatedAt.UTC().Format(time.RFC3339Nano)}
}

// replyStatus maps a Service problem reply to a gRPC status: 400 is
// InvalidArgument (stored and replayed), 503 Unavailable (released), the
// rest Internal (released).
func replyStatus(r Reply) error {
	var p struct {
		Detail string `json:"detail"`
		Title  string `json:"title"`
	}
	_ = json.Unmarshal(r.Body, &p)
	msg := p.Detail
	if msg == "" {
		msg = p.Title
	}
	switch r.Status {
	case http.StatusBadRequest:
		return status.Error(codes.InvalidArgument, msg)
	case http.StatusNotFound:
		return status.Error(codes.NotFound, msg)
	case http.StatusServiceUnavailable:
		return status.Error(codes.Unavailable, msg)
	}
	return status.Error(codes.Internal, msg)
}

// grpcServer serves gRPC until Shutdown.
type grpcServer struct{ s *grpc.Server }

// Serve serves on ln until Shutdown, after which it returns nil.
func (g grpcServer) Serve(ln net.Listener) error {
	if err := g.s.Serve(ln); !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Shutdown stops accepting and waits for in-flight calls, up to ctx.
func (g grpcServer) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() { g.s.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		g.s.Stop()
		return ctx.Err()
	}
}
