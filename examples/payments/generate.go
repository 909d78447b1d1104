package main

// The gRPC API's code is generated with protoc and the plugins at the
// versions named in its header; the generated files are committed.
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative paymentsv1/payments.proto
