#!/usr/bin/env bash
# apt-install.sh NAME PACKAGE... — install Debian packages for the tests or
# the bench: `apt-get update` and `apt-get install -y --no-install-recommends`
# (as root, or through passwordless sudo), quietly, one installer at a time,
# with the output in .tools/install-NAME.log, shown when it fails. The
# install-*.sh scripts call it only when what they need is missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
name="$1"
shift

die() { echo "install-$name: $*" >&2; exit 1; }

command -v apt-get >/dev/null || die "$* missing and apt-get is not available; install it by other means"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
	command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
		die "$* missing; run as root (or with passwordless sudo): apt-get install -y $*"
	sudo=(sudo -n)
fi

mkdir -p "$tools"
# One installer at a time (parallel make or test processes); apt-get itself
# refuses to run twice at once.
if command -v flock >/dev/null; then
	exec 9>"$tools/.apt-install.lock"
	flock 9
fi

log="$tools/install-$name.log"
: >"$log"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >>"$log" 2>&1 ||
	die "apt-get update failed; see $log:
$(tail -n 20 "$log")"
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >>"$log" 2>&1 ||
	die "apt-get install $* failed; see $log:
$(tail -n 20 "$log")"
