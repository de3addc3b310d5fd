#!/usr/bin/env bash
# install-plot.sh — install matplotlib into the project venv .tools/venv,
# for the benchmark plots (scripts/plot.py, run by `make bench`).
#
# On success the script prints only the venv's python path. Safe to run
# again: when that python already imports the pinned matplotlib it prints
# the path and does nothing else (no pip call).
#
# Environment: PYTHON (default python3) picks the interpreter when the venv
# has to be created (scripts/install-envoy.sh shares the same venv).
set -euo pipefail

# Pinned exactly, with its numpy; wheels exist for CPython 3.10–3.13.
MATPLOTLIB_VERSION=3.10.8

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
venv="$tools/venv"
py="$venv/bin/python"
python="${PYTHON:-python3}"

die() { echo "install-plot: $*" >&2; exit 1; }

installed() {
	[[ "$("$py" -c 'import matplotlib; print(matplotlib.__version__)' 2>/dev/null)" == "$MATPLOTLIB_VERSION" ]]
}

if installed; then echo "$py"; exit 0; fi

mkdir -p "$tools"
# One installer at a time; the Envoy installer uses the same venv, so take
# its lock too while the venv may be created.
if command -v flock >/dev/null; then
	exec 8>"$tools/.install-envoy.lock"
	flock 8
	exec 9>"$tools/.install-plot.lock"
	flock 9
	if installed; then echo "$py"; exit 0; fi
fi

log="$tools/install-plot.log"
: >"$log"

if ! "$py" -c '' 2>/dev/null; then
	command -v "$python" >/dev/null || die "$python not found; install Python 3 (with venv) or set PYTHON"
	rm -rf "$venv"
	"$python" -m venv "$venv" >>"$log" 2>&1 ||
		die "cannot create $venv (Debian: apt-get install python3-venv); see $log"
fi

"$py" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
	"matplotlib==${MATPLOTLIB_VERSION}" >>"$log" 2>&1 ||
	die "pip install matplotlib==${MATPLOTLIB_VERSION} failed; see $log:
$(tail -n 20 "$log")"

installed || die "$py does not import matplotlib ${MATPLOTLIB_VERSION}; see $log"
echo "$py"
