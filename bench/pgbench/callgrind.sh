#!/usr/bin/env bash
# callgrind.sh: instructions the PostgreSQL backend executes per transaction
# of each pgbench script, or per request of each load generator variant,
# counted by valgrind's callgrind. Timings of PostgreSQL on a shared
# two-core machine move by ±10 % from run to run; these counts repeat
# within 0.1 % (scripts) or 3.3 % (variants), so a change to a statement or
# to the schema can be judged without a quiet machine.
#
#   bench/pgbench/callgrind.sh                      # the four scripts, ~2 min
#   bench/pgbench/callgrind.sh pgbench/idempgx.sql  # paths relative to bench/
#   bench/pgbench/callgrind.sh -variants            # floor, pgx, gorm, ~3 min
#   bench/pgbench/callgrind.sh -variants pgx,gorm
#
# It starts a throwaway PostgreSQL cluster (initdb in a temporary folder,
# port PORT, default 5499, autovacuum off) under callgrind and creates the
# benchmark tables in it with TestPgbenchScripts (bench.Setup and both
# stores' Migrate).
#
# A script runs under pgbench with one client, -M prepared. -variants runs
# the stores themselves, through bench/cmd/loadgen over HTTP with one
# client and one database connection: what the stores send, in their own
# protocol and batches (idempgx's BEGIN rides in the batch of the handler's
# first statement; idemgorm's settle is one simple-protocol query string).
# Each variant is counted twice: first requests
# (-retry 0, a new key each time) and replays (-retry 1: after its first
# request the client repeats that key).
#
# Each workload runs for LO and then HI transactions or requests (defaults
# 20 and 220) after a warm-up of 20, each run on new connections, so new
# backend processes with their own callgrind output. It prints
#
#   Ir per tx or request = (Ir of the new backends at HI - at LO) / (HI - LO)
#
# The difference cancels the backends' start, the statements' first
# planning and the load generator's own setup (its TRUNCATE, the stores'
# Migrate). Only backends are counted: the WAL writer, the checkpointer
# and the kernel (network, fsync) are not.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PORT:-5499}
lo=${LO:-20}
hi=${HI:-220}
variants=""
if [ "${1:-}" = -variants ]; then
	variants=${2:-floor,pgx,gorm}
	scripts=()
else
	scripts=("$@")
	[ "${#scripts[@]}" -gt 0 ] || scripts=(pgbench/floor.sql pgbench/idempgx.sql pgbench/floor-replay.sql pgbench/idempgx-replay.sql)
fi

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
	# Backends under callgrind may still be writing their files.
	for _ in 1 2 3 4 5; do rm -rf "$dir" 2>/dev/null && break; sleep 1; done
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

[ -z "$variants" ] || go build -o "$dir/loadgen" ./cmd/loadgen

# ir runs "$@" and prints the instructions of the backends that appeared
# meanwhile (callgrind writes a process's file when it exits).
ir() {
	local before after f total=0 n
	before=$(ls "$dir/out" | sort)
	"$@" >"$dir/run.log" 2>&1 || { cat "$dir/run.log" >&2; return 1; }
	for _ in $(seq 30); do
		after=$(ls "$dir/out" | sort)
		[ "$after" != "$before" ] && break
		sleep 1
	done
	sleep 2 # let the files be written out completely
	after=$(ls "$dir/out" | sort)
	for f in $(comm -13 <(echo "$before") <(echo "$after")); do
		n=$(awk '/^totals:/ {print $2}' "$dir/out/$f")
		total=$((total + ${n:-0}))
	done
	echo "$total"
}

# script runs $1 transactions of pgbench script $2 on one connection.
script() {
	local out
	out=$(pgbench -h 127.0.0.1 -p "$port" -U postgres -n -M prepared -c 1 -t "$1" -f "$2" test 2>&1) || { echo "$out"; return 1; }
	echo "$out"
	! grep -q error <<<"$out"
}

# variant sends $1 requests to load generator variant $2 with -retry $3,
# and fails unless every one was answered 201.
variant() {
	local out
	out=$(IDEM_PG_DSN=$dsn "$dir/loadgen" -variants "$2" -clients 1 -conns 1 -retry "$3" \
		-warmup 0 -duration 10m -max-requests "$1" 2>&1) || { echo "$out"; return 1; }
	echo "$out"
	# | variant | clients | req/s | p50 | p99 | 201 first | 201 replayed | 409 | other | errors | load |
	awk -F'|' -v n="$1" '$3 ~ /^ *1 *$/ { ok = ($7 + $8 == n && $9 + $10 + $11 == 0) } END { exit !ok }' <<<"$out"
}

# per runs workload $1 (script or variant) with the rest of the arguments
# for 20, LO and HI and prints the instructions per transaction or request.
per() {
	local w=$1 a b
	shift
	ir "$w" 20 "$@" >/dev/null
	a=$(ir "$w" "$lo" "$@")
	b=$(ir "$w" "$hi" "$@")
	echo $(((b - a) / (hi - lo)))
}

truncate() {
	psql -q -h 127.0.0.1 -p "$port" -U postgres test -c "TRUNCATE idem_bench.floor_keys, idem_bench.pgx_keys, idem_bench.payments_floor, idem_bench.payments_pgx"
	sleep 2 # the TRUNCATE's backend writes its own file as it exits
}
for s in "${scripts[@]}"; do
	truncate
	n=$(per script "$s")
	printf '%-28s %9d Ir/tx\n' "$s" "$n"
done
for v in ${variants//,/ }; do
	first=$(per variant "$v" 0)
	replay=$(per variant "$v" 1)
	printf '%-6s %9d Ir per first request %9d Ir per replay\n' "$v" "$first" "$replay"
done
