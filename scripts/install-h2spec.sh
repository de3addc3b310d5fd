#!/usr/bin/env bash
# install-h2spec.sh — install a pinned h2spec (the HTTP/2 conformance
# suite, github.com/summerwind/h2spec) into the project-local .tools/bin,
# for the test that runs it against the lean Check listener and grpc-go.
# It is built from source with `go install` through the Go module proxy,
# so it needs nothing but Go.
#
# On success the script prints only the binary's path. Safe to run again:
# when .tools/bin/h2spec is already the pinned version it prints the path
# and does nothing else.
set -euo pipefail

# Pinned exactly: the newest version the module proxy serves (later tags
# lack a /v2 module path).
H2SPEC_VERSION=v2.2.1+incompatible

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
bin="$tools/bin/h2spec"
go="${GO:-go}"

die() { echo "install-h2spec: $*" >&2; exit 1; }

# h2spec --version does not name its release; the build info does.
installed() {
	[[ -x "$bin" ]] || return 1
	"$go" version -m "$bin" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]]+github.com/summerwind/h2spec[[:space:]]+${H2SPEC_VERSION//+/\\+}[[:space:]]"
}

if installed; then echo "$bin"; exit 0; fi

mkdir -p "$tools/bin"
# One installer at a time (parallel test processes may call this script).
if command -v flock >/dev/null; then
	exec 9>"$tools/.install-h2spec.lock"
	flock 9
	if installed; then echo "$bin"; exit 0; fi
fi

log="$tools/install-h2spec.log"
# Outside the module, so the project's go.mod is neither read nor changed.
(cd "$tools" && GOBIN="$tools/bin" "$go" install "github.com/summerwind/h2spec/cmd/h2spec@${H2SPEC_VERSION}") >"$log" 2>&1 ||
	die "go install github.com/summerwind/h2spec/cmd/h2spec@${H2SPEC_VERSION} failed; see $log:
$(tail -n 20 "$log")"

installed || die "$bin is not h2spec ${H2SPEC_VERSION}: $("$go" version -m "$bin" 2>&1 | head -n 3)"
echo "$bin"
