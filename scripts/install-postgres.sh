#!/usr/bin/env bash
# install-postgres.sh — make sure PostgreSQL's server binaries are present
# for the tests (internal/testpg starts throwaway clusters with them).
#
# Debian's package "postgresql" puts them in /usr/lib/postgresql/<major>/bin.
# When initdb, pg_ctl and postgres are already there, the script prints that
# directory and does nothing else (no apt call). Otherwise it runs
# `apt-get update` and `apt-get install -y postgresql` (as root, or through
# passwordless sudo), quietly, with the output in .tools/install-postgres.log,
# then prints the directory. The tests never use the cluster the package may
# start; they run their own on free ports.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"

die() { echo "install-postgres: $*" >&2; exit 1; }

# Where Debian puts the server binaries (overridable to test this script).
pg_root="${PG_ROOT:-/usr/lib/postgresql}"

# Prints the newest <major>/bin directory that has all three server binaries.
installed() {
	local d best=""
	while IFS= read -r d; do
		[[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" ]] && best="$d"
	done < <(printf '%s\n' "$pg_root"/*/bin | sort -V)
	[[ -n "$best" ]] && echo "$best"
}

if installed; then exit 0; fi

command -v apt-get >/dev/null || die "PostgreSQL is missing and apt-get is not available; install the PostgreSQL server (initdb, pg_ctl) and set PG_BIN to its bin directory"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
	command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
		die "PostgreSQL is missing; run as root (or with passwordless sudo): apt-get install -y postgresql"
	sudo=(sudo -n)
fi

mkdir -p "$tools"
# One installer at a time (parallel make or test processes).
if command -v flock >/dev/null; then
	exec 9>"$tools/.install-postgres.lock"
	flock 9
	if installed; then exit 0; fi
fi

log="$tools/install-postgres.log"
: >"$log"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >>"$log" 2>&1 ||
	die "apt-get update failed; see $log:
$(tail -n 20 "$log")"
"${sudo[@]}" apt-get install -y -qq --no-install-recommends postgresql >>"$log" 2>&1 ||
	die "apt-get install postgresql failed; see $log:
$(tail -n 20 "$log")"

installed || die "postgresql is installed but no $pg_root/*/bin has initdb, pg_ctl and postgres"
