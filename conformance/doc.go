// Package conformance runs core/adaptertest for every adapter against
// every real store. The adapters' own modules run the suite against
// memstore only, because adapters and stores depend on core alone; this
// test-only module is the one place, besides examples, that depends on all
// of them, through their test-support packages (idemhttptest,
// idemgintest, idemechotest, idemfibertest; idempgxtest, idemgormtest,
// idemredistest).
//
// The matrix is complete: net/http, Gin, Echo and Fiber, each on idempgx
// (PostgreSQL), on idemgorm over PostgreSQL, MySQL/MariaDB and SQLite, and
// on idemredis over the standalone Redis and the three-node Cluster, 24
// runs of the whole suite. Redis shares no transaction with the handler;
// redis_test.go says how its business writes are modelled (undone when the
// attempt is released, as an application on Redis must do itself).
//
// With -race on a 2-core machine and the default -parallel the module
// takes about 30 seconds once built (28 s measured with the Redis rows):
// the suite's subtests mostly wait on leases and deadlines, so no
// combination is left out.
//
// It has no code outside its tests. Run it with the services up
// (make services; IDEM_PG_DSN, IDEM_MYSQL_DSN, IDEM_REDIS_ADDR and
// IDEM_REDIS_CLUSTER name other servers): an
// unreachable database fails the tests, never skips them.
package conformance
