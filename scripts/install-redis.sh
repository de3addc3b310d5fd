#!/usr/bin/env bash
# install-redis.sh — make sure Debian's redis-server is present for the
# bench's envoyproxy/ratelimit anchor (make bench; the tests never need
# it). Prints the binary's path. When it is on PATH the script does
# nothing else; otherwise it runs `apt-get update` and `apt-get install -y
# redis-server` (as root, or through passwordless sudo), quietly, with the
# output in .tools/install-redis.log. The bench runs its own throwaway
# server on a free loopback port, never the one the package may start.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"

die() { echo "install-redis: $*" >&2; exit 1; }

if command -v redis-server; then exit 0; fi

command -v apt-get >/dev/null || die "redis-server is missing and apt-get is not available; install Redis's server"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
	command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
		die "redis-server is missing; run as root (or with passwordless sudo): apt-get install -y redis-server"
	sudo=(sudo -n)
fi

mkdir -p "$tools"
if command -v flock >/dev/null; then
	exec 9>"$tools/.install-redis.lock"
	flock 9
	if command -v redis-server; then exit 0; fi
fi

log="$tools/install-redis.log"
: >"$log"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >>"$log" 2>&1 ||
	die "apt-get update failed; see $log:
$(tail -n 20 "$log")"
"${sudo[@]}" apt-get install -y -qq --no-install-recommends redis-server >>"$log" 2>&1 ||
	die "apt-get install redis-server failed; see $log:
$(tail -n 20 "$log")"

command -v redis-server || die "redis-server is installed but not on PATH"
