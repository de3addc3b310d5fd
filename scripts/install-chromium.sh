#!/usr/bin/env bash
# install-chromium.sh — make sure Debian's chromium is present for the
# end-to-end test that renders the admin status page in a real browser
# (test/e2e, headless). Prints the binary's path. When it is on PATH the
# script does nothing else; otherwise it runs `apt-get update` and
# `apt-get install -y chromium` (as root, or through passwordless sudo),
# quietly, with the output in .tools/install-chromium.log.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"

die() { echo "install-chromium: $*" >&2; exit 1; }

if command -v chromium; then exit 0; fi

command -v apt-get >/dev/null || die "chromium is missing and apt-get is not available; install Chromium, or set E2E_CHROMIUM to a Chromium binary"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
	command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
		die "chromium is missing; run as root (or with passwordless sudo): apt-get install -y chromium"
	sudo=(sudo -n)
fi

mkdir -p "$tools"
if command -v flock >/dev/null; then
	exec 9>"$tools/.install-chromium.lock"
	flock 9
	if command -v chromium; then exit 0; fi
fi

log="$tools/install-chromium.log"
: >"$log"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >>"$log" 2>&1 ||
	die "apt-get update failed; see $log:
$(tail -n 20 "$log")"
"${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium >>"$log" 2>&1 ||
	die "apt-get install chromium failed; see $log:
$(tail -n 20 "$log")"

command -v chromium || die "chromium is installed but not on PATH"
