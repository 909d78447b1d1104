#!/usr/bin/env bash
# callgrind.sh: instructions per iteration of one Go benchmark, counted by
# valgrind's callgrind. Unlike time/op on a shared machine, the count repeats
# within about 1 % from run to run, so two commits can be compared without
# benchstat and without a quiet machine.
#
#   scripts/callgrind.sh                  # the set in BENCHMARKS.md, ~10 min
#   scripts/callgrind.sh <module dir> '<benchmark regex>' [iterations]
#   scripts/callgrind.sh core '^BenchmarkDo$/^FirstCall$'
#   scripts/callgrind.sh bench '^BenchmarkFiberFirst$/^variant=idemfiber-memstore$'
#
# The regex must select exactly one benchmark. It builds the module's test
# binary once (CGO_ENABLED=0: callgrind aborts on the cgo runtime's thread
# start), then runs it under callgrind with -test.benchtime <iterations>x
# (default 2000) and with 1x, RUNS times each (default 3), and prints
#
#   Ir/op = (Ir at <iterations>x - Ir at 1x) / (<iterations> - 1)
#
# for each pair and their median. The 1x run cancels the process start, the
# test binary's init and the benchmark's own setup. GOGC=off leaves the
# garbage collector out (its work depends on heap size and timing and moves
# the count by 10-30 % between sessions; set GOGC=100 to count it anyway),
# GOMAXPROCS=1 keeps the runtime from spreading work over threads whose
# interleaving changes the count, and asyncpreemptoff keeps the preemption
# signal away (callgrind aborts on it).
set -euo pipefail

# Without arguments: the engine's first request and replay, in core (the
# call API on memstore) and through idemfiber beside Fiber's own middleware
# and the bare app (BENCHMARKS.md, "Instructions per request").
if [[ $# -eq 0 ]]; then
	root=$(cd "$(dirname "$0")/.." && pwd)
	while read -r dir bench; do
		"$0" "$root/$dir" "$bench" | tail -1
	done <<'EOF'
core ^BenchmarkDo$/^FirstCall$
core ^BenchmarkDo$/^Replay$
bench ^BenchmarkFiberFirst$/^variant=bare$
bench ^BenchmarkFiberFirst$/^variant=fiber-idempotency$
bench ^BenchmarkFiberFirst$/^variant=idemfiber-memstore$
bench ^BenchmarkFiberReplay$/^variant=bare$
bench ^BenchmarkFiberReplay$/^variant=fiber-idempotency$
bench ^BenchmarkFiberReplay$/^variant=idemfiber-memstore$
EOF
	exit 0
fi
if [[ $# -lt 2 ]]; then
	sed -n '2,14p' "$0" >&2
	exit 2
fi
dir=$1 bench=$2 n=${3:-2000} runs=${RUNS:-3}
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$dir" && CGO_ENABLED=0 go test -c -o "$tmp/b.test" .)

# ir runs the benchmark for $1 iterations under callgrind and prints the
# instruction count (Ir) of the whole process.
ir() {
	local out
	out=$(cd "$dir" && GOGC=${GOGC:-off} GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 \
		valgrind --tool=callgrind --callgrind-out-file=/dev/null \
		"$tmp/b.test" -test.run '^$' -test.bench "$bench" -test.benchtime "${1}x" -test.count 1 2>&1)
	if ! grep -q '^ok\|^PASS' <<<"$out"; then
		echo "callgrind.sh: the benchmark failed:" >&2
		echo "$out" >&2
		exit 1
	fi
	if [[ $(grep -c '^Benchmark' <<<"$out") -ne 1 ]]; then
		echo "callgrind.sh: '$bench' must select exactly one benchmark:" >&2
		grep '^Benchmark' <<<"$out" >&2
		exit 1
	fi
	grep -o 'Collected : [0-9]*' <<<"$out" | awk '{print $3}'
}

per=()
for ((i = 0; i < runs; i++)); do
	big=$(ir "$n")
	one=$(ir 1)
	v=$(( (big - one) / (n - 1) ))
	per+=("$v")
	echo "run $((i + 1)): Ir ${n}x = $big, Ir 1x = $one, Ir/op = $v"
done
median=$(printf '%s\n' "${per[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "$bench: $median Ir/op (median of $runs, GOGC=${GOGC:-off})"
