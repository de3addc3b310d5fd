#!/usr/bin/env bash
# install-postgres.sh — make sure PostgreSQL's server binaries are present
# for the tests (internal/testpg starts throwaway clusters with them).
#
# Debian's package "postgresql" puts them in /usr/lib/postgresql/<major>/bin.
# When initdb, pg_ctl and postgres are already there, the script prints that
# directory and does nothing else (no apt call). Otherwise it runs
# scripts/apt-install.sh (`apt-get install -y postgresql`, as root or
# through passwordless sudo, output in .tools/install-postgres.log), then
# prints the directory. The tests never use the cluster the package may
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

"$root/scripts/apt-install.sh" postgres postgresql

installed || die "postgresql is installed but no $pg_root/*/bin has initdb, pg_ctl and postgres"
