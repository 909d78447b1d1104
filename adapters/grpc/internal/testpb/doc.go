// Package testpb is the small gRPC service idemgrpc's tests and its
// conformance suite call through the interceptor. Its .pb.go files are
// generated from test.proto (see ../../generate.go); do not edit them.
package testpb
