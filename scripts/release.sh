#!/usr/bin/env bash
# release.sh checks that idem's modules can be released together and prints
# (or, with --tag, creates) the lockstep tags.
#
#   scripts/release.sh            dry run: every check, then the tags it would create
#   scripts/release.sh --check    the checks make lint runs: requires agree, go mod tidy changes nothing
#   scripts/release.sh --tag      the dry run's checks, then git tag for every module
#
# All modules move in lockstep (docs/design.md, "Layout"): every go.mod that needs
# a sibling requires it at the same release version, with a replace to its
# folder for development, and that version is the one being released. The
# checks, in order:
#   1. every require of a sibling names the same version, and not a
#      placeholder (v0.0.0-…), and has a replace to the sibling's folder;
#   2. go mod tidy changes no go.mod or go.sum (run with GOWORK=off, so each
#      module resolves its siblings through its own replaces, as a user's
#      build resolves them through the tags);
#   3. GOWORK=off go build ./... && go vet ./... pass in each module (not in
#      --check mode: make lint vets through the workspace already).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=dry
case "${1:-}" in
"") ;;
--check) mode=check ;;
--tag) mode=tag ;;
*) echo "usage: $0 [--check|--tag]" >&2; exit 2 ;;
esac

prefix=github.com/idemgo/idem/
fail() { printf 'release: %s\n' "$*" >&2; exit 1; }

# Every module of the repository: each folder with a go.mod, bench/fiberv3
# included (it requires no sibling, but must stay tidy).
mapfile -t mods < <(git ls-files '*go.mod' | xargs -n1 dirname | sort -u)
[ "${#mods[@]}" -gt 0 ] || fail "no go.mod found"

# 1. The sibling requires agree.
version=""
for m in "${mods[@]}"; do
	# "require path version" lines, single or inside a block, for siblings.
	while read -r path ver; do
		[ -n "$path" ] || continue
		case "$ver" in
		v0.0.0-*) fail "$m/go.mod requires $path at the placeholder $ver: name the release version" ;;
		esac
		if [ -z "$version" ]; then
			version=$ver
		elif [ "$ver" != "$version" ]; then
			fail "$m/go.mod requires $path at $ver, but other modules require siblings at $version: all move in lockstep"
		fi
		dir=${path#"$prefix"}
		want=$(realpath --relative-to="$m" "$dir")
		grep -Eq "^[[:space:]]*(replace[[:space:]]+)?${path//./\\.}[[:space:]]+=>[[:space:]]+${want//./\\.}[[:space:]]*\$" "$m/go.mod" ||
			fail "$m/go.mod requires $path but has no 'replace $path => $want'"
	done < <(GOWORK=off go mod edit -json "$m/go.mod" |
		python3 -c 'import json,sys; [print(r["Path"], r["Version"]) for r in (json.load(sys.stdin).get("Require") or []) if r["Path"].startswith(sys.argv[1])]' "$prefix")
done
[ -n "$version" ] || fail "no module requires a sibling: nothing to check"

# 2. go mod tidy leaves every module as it is (-diff changes no file).
for m in "${mods[@]}"; do
	if ! out=$(cd "$m" && GOWORK=off go mod tidy -diff 2>&1); then
		printf '%s\n' "$out" >&2
		fail "go mod tidy would change $m/go.mod or go.sum: run it there (GOWORK=off go mod tidy) and commit the result"
	fi
done
printf 'release: %d modules; every sibling required at %s; go mod tidy changes nothing\n' "${#mods[@]}" "$version"
[ "$mode" = check ] && exit 0

# 3. Each module builds and vets on its own.
for m in "${mods[@]}"; do
	(cd "$m" && GOWORK=off go build ./... && GOWORK=off go vet ./...) || fail "GOWORK=off build or vet failed in $m"
done
printf 'release: every module builds and vets with GOWORK=off\n'

# The tags: one per module, the folder's path and the version. The examples,
# bench and conformance modules are released with the rest so their
# requires resolve, though nobody imports them.
for m in "${mods[@]}"; do
	tag="$m/$version"
	if [ "$mode" = tag ]; then
		git rev-parse -q --verify "refs/tags/$tag" >/dev/null && fail "tag $tag exists already"
		git tag "$tag"
		printf 'tagged %s\n' "$tag"
	else
		printf 'would tag %s\n' "$tag"
	fi
done
