#!/usr/bin/env bash
# benchcmp.sh — compare Go benchmarks of two commits on a noisy machine.
#
# Builds the test binary of PKG at OLD and at NEW (each in a throwaway
# worktree), runs the two alternately COUNT times (default 6), so that load
# from elsewhere falls on both alike, and prints benchstat's comparison.
#
# Usage: scripts/benchcmp.sh OLD NEW PKG BENCH-REGEX [COUNT]
#   e.g. scripts/benchcmp.sh main~3 HEAD ./internal/authz 'BenchmarkCheck' 6
set -euo pipefail
[[ $# -ge 4 ]] || { sed -n '2,10p' "$0" >&2; exit 2; }
old=$1 new=$2 pkg=$3 re=$4 n=${5:-6}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
d=$(mktemp -d "${TMPDIR:-/tmp}/benchcmp.XXXX")
cleanup() {
	for c in old new; do git -C "$root" worktree remove --force "$d/src-$c" 2>/dev/null || true; done
}
trap cleanup EXIT
for c in old new; do
	git -C "$root" worktree add -q --detach "$d/src-$c" "${!c}"
	(cd "$d/src-$c" && go test -c -o "$d/$c.test" "$pkg")
done
for _ in $(seq "$n"); do
	for c in old new; do
		(cd "$d/src-$c/$pkg" && "$d/$c.test" -test.run '^$' -test.bench "$re" -test.benchmem -test.count 1) | grep -E '^Benchmark' >>"$d/$c.txt"
	done
done
go run golang.org/x/perf/cmd/benchstat@latest "$d/old.txt" "$d/new.txt"
echo "raw results: $d/old.txt $d/new.txt"
