#!/usr/bin/env bash
# callgrind.sh: instructions the PostgreSQL backend executes per transaction
# of each pgbench script, counted by valgrind's callgrind. Timings of
# PostgreSQL on a shared two-core machine move by ±10 % from run to run;
# these counts repeat within 0.1 %, so a change to a statement or to the
# schema can be judged without a quiet machine.
#
#   bench/pgbench/callgrind.sh                      # the four scripts, ~2 min
#   bench/pgbench/callgrind.sh pgbench/idempgx.sql  # paths relative to bench/
#
# It starts a throwaway PostgreSQL cluster (initdb in a temporary folder,
# port PORT, default 5499, autovacuum off) under callgrind, creates the
# benchmark tables in it with TestPgbenchScripts (bench.Setup and both
# stores' Migrate), and for each script runs pgbench with one client for
# LO and then HI transactions (defaults 20 and 220) after a warm-up of 50,
# each run on a new connection, so a new backend process with its own
# callgrind output. It prints
#
#   Ir/tx = (Ir of the backend at HI - Ir at LO) / (HI - LO)
#
# The difference cancels the backend's start and the statements' first
# planning. Only the backend is counted: the WAL writer, the checkpointer
# and the kernel (network, fsync) are not.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PORT:-5499}
lo=${LO:-20}
hi=${HI:-220}
scripts=("$@")
[ "${#scripts[@]}" -gt 0 ] || scripts=(pgbench/floor.sql pgbench/idempgx.sql pgbench/floor-replay.sql pgbench/idempgx-replay.sql)

command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 1; }
command -v pgbench >/dev/null || { echo "pgbench not found (it comes with the PostgreSQL server package)" >&2; exit 1; }
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bindir/initdb" ] || { echo "initdb not found under /usr/lib/postgresql/*/bin" >&2; exit 1; }

dir=$(mktemp -d /tmp/idem-pgcg.XXXXXX)
mkdir "$dir/out"
# initdb and postgres refuse to run as root.
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$1"; else bash -c "$1"; fi; }
[ "$(id -u)" != 0 ] || chown -R postgres "$dir"
pid=""
cleanup() {
	[ -z "$pid" ] || as_pg "$bindir/pg_ctl -D $dir/data -m immediate stop" >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT
as_pg "$bindir/initdb -D $dir/data -A trust -U postgres" >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
as_pg "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=$dir/out/cg.%p \
	$bindir/postgres -D $dir/data -p $port -k $dir -c listen_addresses=127.0.0.1 -c autovacuum=off \
	>$dir/server.log 2>&1 & echo \$! >$dir/pid"
pid=$(cat "$dir/pid")
for _ in $(seq 120); do
	pg_isready -q -h 127.0.0.1 -p "$port" && break
	sleep 1
done
pg_isready -q -h 127.0.0.1 -p "$port" || { echo "the cluster under callgrind did not start:" >&2; cat "$dir/server.log" >&2; exit 1; }
psql -q -h 127.0.0.1 -p "$port" -U postgres -c "CREATE DATABASE test"
dsn="postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
IDEM_PG_DSN=$dsn go test -count=1 -run '^TestPgbenchScripts$' . >"$dir/setup.log" 2>&1 || { cat "$dir/setup.log" >&2; exit 1; }

# ir runs script $1 for $2 transactions on one connection and prints the
# instructions of the backend that served it (the output files that
# appeared meanwhile: callgrind writes a process's file when it exits).
ir() {
	local before after f total=0 n
	before=$(ls "$dir/out" | sort)
	pgbench -h 127.0.0.1 -p "$port" -U postgres -n -M prepared -c 1 -t "$2" -f "$1" test >"$dir/pgbench.log" 2>&1 ||
		{ cat "$dir/pgbench.log" >&2; return 1; }
	for _ in $(seq 30); do
		after=$(ls "$dir/out" | sort)
		[ "$after" != "$before" ] && break
		sleep 1
	done
	sleep 2 # let the file be written out completely
	after=$(ls "$dir/out" | sort)
	for f in $(comm -13 <(echo "$before") <(echo "$after")); do
		n=$(awk '/^totals:/ {print $2}' "$dir/out/$f")
		total=$((total + ${n:-0}))
	done
	echo "$total"
}
for s in "${scripts[@]}"; do
	psql -q -h 127.0.0.1 -p "$port" -U postgres test -c "TRUNCATE idem_bench.floor_keys, idem_bench.pgx_keys, idem_bench.payments_floor, idem_bench.payments_pgx"
	sleep 2 # the TRUNCATE's backend writes its own file as it exits
	ir "$s" 50 >/dev/null
	a=$(ir "$s" "$lo")
	b=$(ir "$s" "$hi")
	printf '%-28s %9d Ir/tx\n' "$s" $(((b - a) / (hi - lo)))
done
