#!/usr/bin/env bash
# install-chromium.sh — make sure Debian's chromium is present for the
# end-to-end test that renders the admin status page in a real browser
# (test/e2e, headless). Prints the binary's path; installs the package
# (scripts/apt-install.sh) only when chromium is not on PATH.
set -euo pipefail
scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v chromium && exit 0
"$scripts/apt-install.sh" chromium chromium
command -v chromium || { echo "install-chromium: chromium is installed but not on PATH" >&2; exit 1; }
