#!/usr/bin/env bash
# install-redis.sh — make sure Debian's redis-server is present for the
# bench's envoyproxy/ratelimit anchor (make bench; the tests never need
# it). Prints the binary's path; installs the package
# (scripts/apt-install.sh) only when redis-server is not on PATH. The bench
# runs its own throwaway server on a free loopback port, never the one the
# package may start.
set -euo pipefail
scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v redis-server && exit 0
"$scripts/apt-install.sh" redis redis-server
command -v redis-server || { echo "install-redis: redis-server is installed but not on PATH" >&2; exit 1; }
