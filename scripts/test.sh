#!/usr/bin/env bash
# test.sh runs every module's tests with -race, JOBS modules at a time
# (default 3: the tests spend most of their time waiting on leases,
# timeouts and the databases, not on the two CPUs), and prints each
# module's output in one block when it ends, then a line per module with
# its time. It fails when any module fails, and says which.
#
# Every test works in its own schema, table or key prefix, so modules can
# run side by side on the shared servers as packages of one module do.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
JOBS=${JOBS:-3}
modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
	echo "usage: scripts/test.sh module..." >&2
	exit 2
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
trap 'trap - INT TERM; kill 0; exit 130' INT TERM

run() { # module index
	local m=$1 i=$2 start end rc
	start=$(date +%s)
	(cd "$m" && "$GO" test -race -count=1 -timeout 12m ./...) >"$out/$i.log" 2>&1
	rc=$?
	end=$(date +%s)
	{
		echo "== $m"
		cat "$out/$i.log"
	} >"$out/$i.done"
	echo "$rc $((end - start)) $m" >"$out/$i.rc"
	cat "$out/$i.done"
}

running=0
for i in "${!modules[@]}"; do
	if [ "$running" -ge "$JOBS" ]; then
		wait -n
		running=$((running - 1))
	fi
	run "${modules[$i]}" "$i" &
	running=$((running + 1))
done
wait

failed=0
echo "== times (seconds, module)"
for i in "${!modules[@]}"; do
	read -r rc secs m <"$out/$i.rc"
	if [ "$rc" -ne 0 ]; then
		echo "$secs $m FAILED"
		failed=1
	else
		echo "$secs $m"
	fi
done
exit $failed
