#!/usr/bin/env bash
# The example service (examples/payments) on three stores side by side, driven by the same load
# generator (cmd/loadgen -target): pgx (records and payments in one PostgreSQL transaction),
# redis with the payments in PostgreSQL, redis with the payments in SQLite. Needs the services
# of `make services` (PostgreSQL on 5432, Redis on 6379). Extra arguments go to loadgen:
#
#   bench/example/run.sh -duration 5s -clients 1,8,32 -rounds 2 -warmup 1s
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
(cd "$root/examples" && go build -o "$tmp/payments" ./payments)
schema=bex_$RANDOM
pg="postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
psql -q "$pg" -c "CREATE SCHEMA ${schema}_pgx; CREATE SCHEMA ${schema}_redis"
pids=()
cleanup() {
	kill "${pids[@]}" 2>/dev/null || true
	wait "${pids[@]}" 2>/dev/null || true
	psql -q "$pg" -c "DROP SCHEMA ${schema}_pgx CASCADE; DROP SCHEMA ${schema}_redis CASCADE" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
# The services log one line per request; the load generator prints the results.
"$tmp/payments" -addr 127.0.0.1:18301 -store pgx -dsn "$pg&search_path=${schema}_pgx" 2>/dev/null & pids+=($!)
"$tmp/payments" -addr 127.0.0.1:18302 -store redis -payments-db "$pg&search_path=${schema}_redis" 2>/dev/null & pids+=($!)
"$tmp/payments" -addr 127.0.0.1:18303 -store redis -payments-db "$tmp/payments.db" 2>/dev/null & pids+=($!)
for port in 18301 18302 18303; do
	for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
done
cd "$root/bench"
go run ./cmd/loadgen "$@" \
	-target "pgx=http://127.0.0.1:18301/payments,redis+postgres=http://127.0.0.1:18302/payments,redis+sqlite=http://127.0.0.1:18303/payments"
