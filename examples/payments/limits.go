package main

import (
	"time"

	idem "github.com/idemgo/idem/core"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// The server's limits: what one slow or idle client may hold. idem bounds
// the handler and its store calls; the time a request spends on the wire
// is the server's to bound.
const (
	// readHeaderTimeout bounds the request line and headers.
	readHeaderTimeout = 10 * time.Second
	// readTimeout bounds the whole request, body included: a client that
	// declares a body and trickles it (or sends 1 byte and stops) is cut
	// after this, instead of holding a connection and a goroutine forever.
	// The service's bodies are at most 1 MiB (Config.MaxBodyBytes).
	readTimeout = 15 * time.Second
	// idleTimeout closes a keep-alive connection that carries no request.
	idleTimeout = time.Minute
	// maxHeaderBytes bounds the request headers (net/http's default is
	// 1 MiB; a key, a request id and a token need far less).
	maxHeaderBytes = 64 << 10
	// maxGRPCMessage bounds a gRPC request message, as MaxBodyBytes bounds
	// an HTTP body.
	maxGRPCMessage = 1 << 20
)

// writeTimeout bounds the time from the end of the request's headers to
// the end of the response: the handler's deadline, then the commit, then
// the write itself. It must exceed RequestTimeout + StoreTimeout, or a
// response the store has committed could be cut on its way out (the client
// then retries and gets the replay, but for nothing).
func writeTimeout(cfg idem.Config) time.Duration {
	rt, st := cfg.RequestTimeout, cfg.StoreTimeout
	if rt == 0 {
		rt = idem.DefaultRequestTimeout
	}
	if st == 0 {
		st = idem.DefaultStoreTimeout
	}
	return readTimeout + rt + st + 10*time.Second
}

// grpcLimits are the gRPC server's counterparts: a bounded message, a
// bounded number of streams per connection, idle connections closed, and
// clients that ping too often cut.
func grpcLimits() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxGRPCMessage),
		grpc.MaxConcurrentStreams(100),
		grpc.ConnectionTimeout(readHeaderTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second}),
	}
}
