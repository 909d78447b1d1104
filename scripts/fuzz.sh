#!/usr/bin/env bash
# fuzz.sh runs every fuzz target of the repository for FUZZTIME each
# (default 30s), one after the other, and stops at the first that fails
# (go test then writes the failing input under the package's
# testdata/fuzz). The targets are found, not listed: every func FuzzXxx in
# a _test.go file tracked by git, so a new target runs without a change
# here.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}

targets=$(git grep -n -E '^func Fuzz[A-Z0-9][A-Za-z0-9_]*\(' -- '*_test.go' |
	sed -E 's#^(.*)/[^/]*_test\.go:[0-9]+:func (Fuzz[A-Za-z0-9_]*)\(.*#\1 \2#' | sort)
if [ -z "$targets" ]; then
	echo "fuzz.sh: no fuzz targets found" >&2
	exit 1
fi
echo "$targets" | while read -r dir name; do
	echo "== $dir $name ($FUZZTIME)"
	(cd "$dir" && "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 5s .)
done
