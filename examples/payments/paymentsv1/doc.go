// Package paymentsv1 is the generated code of payments.proto, the
// payments.v1.Payments gRPC service the example serves with -grpc-addr
// (CreatePayment, ListPayments) behind its auth and idem interceptors. The
// .pb.go files are generated; do not edit them.
package paymentsv1
