#!/usr/bin/env bash
# fuzz.sh — run every Go fuzz target of the module for a bounded time.
#
# Each `func FuzzXxx(f *testing.F)` in a *_test.go file is run with
# `go test -fuzz` for FUZZTIME on its own: a count of inputs (default
# 10000x) or a duration (5m). The default is a count because a duration
# can end a clean run with a spurious "context deadline exceeded" on a busy
# machine (golang/go#75804, fixed after Go 1.26). Its seed corpus
# (f.Add seeds and testdata/fuzz/FuzzXxx/) runs first. A failure stops the
# script with the fuzzer's output, which names the input it wrote under
# testdata/fuzz/: commit that file and it becomes a regular test case.
#
# Usage: scripts/fuzz.sh [package-pattern ...]   (default ./...)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fuzztime="${FUZZTIME:-10000x}"
go="${GO:-go}"
pkgs=("$@")
[[ ${#pkgs[@]} -gt 0 ]] || pkgs=(./...)

targets=0
while IFS= read -r dir; do
	[[ -n "$dir" ]] || continue
	rel="./${dir#"$PWD"/}"
	[[ "$dir" == "$PWD" ]] && rel=.
	names=$(grep -hoE '^func Fuzz[A-Za-z0-9_]+\(' "$dir"/*_test.go 2>/dev/null | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/' | sort -u) || true
	for name in $names; do
		echo "fuzz $rel $name ($fuzztime)"
		# -parallel bounds the workers: the machine may be shared with other tests.
		# -fuzzminimizetime bounds the minimising of each new input, during
		# which no input runs: the default minute can stall a short run.
		timeout --kill-after=30s 600s "$go" test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime 5s -parallel 2 "$rel"
		targets=$((targets + 1))
	done
done < <("$go" list -f '{{.Dir}}' "${pkgs[@]}")
echo "fuzz: $targets targets, $fuzztime each"
