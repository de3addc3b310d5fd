#!/usr/bin/env bash
# install-nats.sh — install a pinned nats-server into the project-local
# .tools/bin, for the tests that run NATS as a separate process (stopped and
# restarted under load). It is built from source with `go install` through
# the Go module proxy, so it needs nothing but Go.
#
# On success the script prints only the binary's path. Safe to run again:
# when .tools/bin/nats-server already reports the pinned version it prints
# the path and does nothing else.
set -euo pipefail

# Pinned exactly; the same version go.mod requires for the in-process server.
NATS_VERSION=v2.15.2

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
bin="$tools/bin/nats-server"
go="${GO:-go}"

die() { echo "install-nats: $*" >&2; exit 1; }

installed() {
	[[ -x "$bin" ]] || return 1
	local v
	v="$("$bin" --version 2>/dev/null)" || return 1
	[[ "$v" == *"${NATS_VERSION}"* ]] || return 1
}

if installed; then echo "$bin"; exit 0; fi

mkdir -p "$tools/bin"
# One installer at a time (parallel test processes may call this script).
if command -v flock >/dev/null; then
	exec 9>"$tools/.install-nats.lock"
	flock 9
	if installed; then echo "$bin"; exit 0; fi
fi

log="$tools/install-nats.log"
# Outside the module, so the project's go.mod is neither read nor changed.
(cd "$tools" && GOBIN="$tools/bin" "$go" install "github.com/nats-io/nats-server/v2@${NATS_VERSION}") >"$log" 2>&1 ||
	die "go install github.com/nats-io/nats-server/v2@${NATS_VERSION} failed; see $log:
$(tail -n 20 "$log")"

installed || die "$bin does not report ${NATS_VERSION}: $("$bin" --version 2>&1 | head -n 3)"
echo "$bin"
