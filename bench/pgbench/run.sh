#!/usr/bin/env bash
# Compares what PostgreSQL alone spends on a first request of the
# hand-written floor and of idempgx, without Go in the way: pgbench runs
# each script's statements (floor.sql, idempgx.sql) with CLIENTS clients
# for SECONDS seconds, ROUNDS times interleaved, and prints each run's tps.
#
#   bench/pgbench/run.sh            # from the repository root; ~1 min
#   ROUNDS=5 SECONDS_PER_RUN=10 CLIENTS=8 bench/pgbench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dsn_host=${PGHOST:-127.0.0.1}
rounds=${ROUNDS:-3}
secs=${SECONDS_PER_RUN:-5}
clients=${CLIENTS:-8}
command -v pgbench >/dev/null || { echo "pgbench not found (apt-get install postgresql-client)" >&2; exit 1; }
# The tables: bench.Setup and both stores' Migrate, as every benchmark does.
go test -count=1 -run 'TestWALPerRequest' . >/dev/null
for r in $(seq "$rounds"); do
	for s in floor idempgx; do
		tps=$(pgbench -h "$dsn_host" -U postgres -n -M prepared -T "$secs" -c "$clients" -j 2 -f "pgbench/$s.sql" test 2>&1 |
			awk '/^tps/ {print $3}')
		printf 'round %d  %-8s %s tps  (load average %s)\n' "$r" "$s" "$tps" "$(cut -d' ' -f1 /proc/loadavg)"
	done
done
