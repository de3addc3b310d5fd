#!/usr/bin/env bash
# fuzz.sh — run every Go fuzz target of the module for a bounded time.
#
# Each `func FuzzXxx(f *testing.F)` in a *_test.go file is run with
# `go test -fuzz` for FUZZTIME on its own: a count of inputs (default
# 10000x) or a duration (5m). The default is a count because a duration
# can end a clean run with a spurious "context deadline exceeded" on a busy
# machine (golang/go#75804, fixed after Go 1.26). Its seed corpus
# (f.Add seeds and testdata/fuzz/FuzzXxx/) runs first. FUZZJOBS targets
# run at once (default 2), each with one fuzzing worker: building a
# target's instrumented test binary is mostly one core's work, so two at
# a time keep two cores busy. A failure stops the script with the
# fuzzer's output, which names the input it wrote under testdata/fuzz/:
# commit that file and it becomes a regular test case.
#
# Usage: scripts/fuzz.sh [package-pattern ...]   (default ./...)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fuzztime="${FUZZTIME:-10000x}"
jobs="${FUZZJOBS:-2}"
go="${GO:-go}"
pkgs=("$@")
[[ ${#pkgs[@]} -gt 0 ]] || pkgs=(./...)

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# fuzz_one runs one target, its output in a file of its own, shown when it
# fails. -fuzzminimizetime bounds the minimising of each new input, during
# which no input runs: the default minute can stall a short run.
fuzz_one() {
	local rel=$1 name=$2 log="$out/${2}.$RANDOM.log"
	if ! timeout --kill-after=30s 600s "$go" test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" \
		-fuzzminimizetime 5s -parallel 1 "$rel" >"$log" 2>&1; then
		echo "FAIL: fuzz $rel $name" >&2
		cat "$log" >&2
		return 255 # xargs stops at the first failure
	fi
	echo "fuzz $rel $name ($fuzztime): ok"
}
export -f fuzz_one
export go fuzztime out

targets=()
while IFS= read -r dir; do
	[[ -n "$dir" ]] || continue
	rel="./${dir#"$PWD"/}"
	[[ "$dir" == "$PWD" ]] && rel=.
	names=$(grep -hoE '^func Fuzz[A-Za-z0-9_]+\(' "$dir"/*_test.go 2>/dev/null | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/' | sort -u) || true
	for name in $names; do
		targets+=("$rel" "$name")
	done
done < <("$go" list -f '{{.Dir}}' "${pkgs[@]}")

printf '%s\n' "${targets[@]}" | xargs -d '\n' -n 2 -P "$jobs" bash -c 'fuzz_one "$@"' _
echo "fuzz: $((${#targets[@]} / 2)) targets, $fuzztime each, $jobs at a time"
