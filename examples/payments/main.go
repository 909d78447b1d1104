// Command payments is the idem example service: a small payments API whose
// POST /payments is idempotent, on any of the supported web frameworks and
// stores. By default it runs Gin on an SQLite file through GORM, so it
// needs no database server:
//
//	go run ./examples/payments
//
// See README.md for the flags, the API and a curl session.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	idem "github.com/idemgo/idem/core"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// server is what each framework file builds: something that serves on a
// listener until Shutdown.
type server interface {
	Serve(ln net.Listener) error
	Shutdown(ctx context.Context) error
}

// app is everything a framework file needs to mount the service.
type app struct {
	// engine is the service's one idempotency engine: the framework's
	// middleware, the gRPC interceptor and the sweeper share it, and with
	// it its per-route hold times and in-flight limit. The framework file
	// adds the Principal function of its adapter.
	engine  *idem.Engine
	svc     *Service
	metrics http.Handler
	log     *slog.Logger
}

// frameworks maps -framework to the function that mounts the service.
var frameworks = map[string]func(a *app) (server, error){}

// shutdownGrace bounds the graceful shutdown.
const shutdownGrace = 15 * time.Second

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "payments: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if cfg.providerOnly {
		return runProvider(ctx, cfg, log)
	}
	if cfg.keyFileCreated {
		log.Warn("generated a fingerprint key for this machine; several instances must share one key: pass -fingerprint-key from a secret store",
			slog.String("file", cfg.fingerprintKeyFile))
	}
	newServer, ok := frameworks[cfg.framework]
	if !ok {
		fmt.Fprintf(stderr, "payments: framework %q is not built into this binary\n", cfg.framework)
		return 2
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	be, err := openBackend(openCtx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "payments: %s\n", oneLine(err))
		return 1
	}
	defer be.close()

	m, metricsHandler, err := newMetrics()
	if err != nil {
		fmt.Fprintf(stderr, "payments: %s\n", oneLine(err))
		return 1
	}
	ic := cfg.idemConfig(be.store)
	ic.Observer, ic.Logger, ic.Reconcile = m, log, be.reconcile
	svc := &Service{Repo: be.repo, Delay: cfg.handlerDelay, SimulateFailures: cfg.simulateFailures, Log: log}
	if cfg.providerURL != "" {
		// Charges go through the provider; a stale claim is reconciled
		// by asking it what the crashed attempt charged.
		svc.Provider = newProviderClient(cfg.providerURL)
		ic.Reconcile = providerReconcile(svc.Provider, be.repo, be.reconcile, log)
	}
	// One engine for the whole service. New checks the store once more
	// (openBackend migrated it); a store it calls misconfigured stops the
	// service here, before it listens.
	eng, err := idem.New(ic)
	if err != nil {
		fmt.Fprintf(stderr, "payments: %s\n", oneLine(err))
		return 1
	}
	a := &app{
		engine:  eng,
		svc:     svc,
		metrics: metricsHandler,
		log:     log,
	}
	srv, err := newServer(a)
	if err != nil {
		fmt.Fprintf(stderr, "payments: %s\n", oneLine(err))
		return 2
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		fmt.Fprintf(stderr, "payments: %s\n", oneLine(err))
		return 1
	}
	// -grpc-addr: the gRPC API on the same Service and store.
	var (
		grpcSrv server
		grpcLn  net.Listener
	)
	if cfg.grpcAddr != "" {
		gs, err := newGRPCServer(a)
		if err != nil {
			fmt.Fprintf(stderr, "payments: %s\n", oneLine(err))
			return 2
		}
		if grpcLn, err = net.Listen("tcp", cfg.grpcAddr); err != nil {
			fmt.Fprintf(stderr, "payments: %s\n", oneLine(err))
			return 1
		}
		grpcSrv = grpcServer{s: gs}
	}
	ec := eng.Config()
	log.Info("payments service listening",
		slog.String("addr", ln.Addr().String()), slog.String("framework", cfg.framework),
		slog.String("store", cfg.store), slog.String("database", be.where),
		slog.Duration("request_timeout", ec.RequestTimeout), slog.Duration("lease", ec.Lease),
		slog.Duration("handler_delay", cfg.handlerDelay), slog.Bool("simulate_failures", cfg.simulateFailures),
		slog.String("provider", cfg.providerURL))

	// The sweeper deletes expired records; correctness never waits for it.
	// It runs on the middleware's engine.
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		// With the engine (and so its Reconcile: the provider's, or
		// redis's row lookup) the sweeper also resolves the stale claims
		// no client retries.
		sw := &idem.Sweeper{Engine: eng, Interval: time.Minute, Logger: log, Observer: m, CountRecords: true}
		_ = sw.Run(sweepCtx)
	}()

	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(ln) }()
	servers := []server{srv}
	if grpcSrv != nil {
		log.Info("payments gRPC listening", slog.String("addr", grpcLn.Addr().String()))
		go func() { serveErr <- grpcSrv.Serve(grpcLn) }()
		servers = append(servers, grpcSrv)
	}

	code := 0
	select {
	case err := <-serveErr:
		if err != nil {
			log.Error("server failed", slog.String("error", err.Error()))
			code = 1
		}
	case <-ctx.Done():
		log.Info("shutting down: finishing in-flight requests")
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		for _, s := range servers {
			if err := s.Shutdown(sctx); err != nil {
				log.Error("shutdown", slog.String("error", err.Error()))
				code = 1
			}
		}
		cancel()
		for range servers {
			if err := <-serveErr; err != nil {
				log.Error("server failed", slog.String("error", err.Error()))
				code = 1
			}
		}
	}
	stopSweep()
	<-sweepDone
	log.Info("stopped")
	return code
}

// httpServer serves a net/http handler (net/http itself, Gin, Echo).
type httpServer struct{ s *http.Server }

// It sets every timeout (see limits.go): without them one client could hold
// a connection and its buffers as long as it likes.
func newHTTPServer(h http.Handler, cfg idem.Config) *httpServer {
	return &httpServer{s: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout(cfg),
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}}
}

// Serve serves until Shutdown, after which it returns nil.
func (h *httpServer) Serve(ln net.Listener) error {
	if err := h.s.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops accepting and waits for in-flight requests.
func (h *httpServer) Shutdown(ctx context.Context) error { return h.s.Shutdown(ctx) }

// runProvider serves the fake payment provider alone on cfg.addr
// (-provider-only) until ctx is done.
func runProvider(ctx context.Context, cfg config, log *slog.Logger) int {
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		log.Error("provider", slog.String("error", err.Error()))
		return 1
	}
	// The provider answers at once: the service's own defaults bound it.
	srv := newHTTPServer(newFakeProvider().handler(), idem.Config{})
	log.Info("fake payment provider listening", slog.String("addr", ln.Addr().String()))
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		log.Error("provider failed", slog.String("error", fmt.Sprint(err)))
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return 1
	}
	<-serveErr
	return 0
}
