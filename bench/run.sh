#!/usr/bin/env bash
# run.sh — `make bench`: every benchmark scenario, about ten minutes on
# two cores (the floor scenario also builds the server of --baseline-ref
# from git). Writes bench/results/REPORT.md, results.json and
# the PNG plots; raw runs and logs go to bench/results/runs and logs.
#
# Arguments go to the runner: `bench/run.sh --quick` checks the pipeline
# in about five minutes, `bench/run.sh --only floor,envoy` runs a subset,
# `bench/run.sh --help` lists the rest. The runner builds the server and
# the load tool, installs Envoy (scripts/install-envoy.sh), nats-server
# (scripts/install-nats.sh) and matplotlib (scripts/install-plot.sh) when
# needed, and stops every process it starts by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec go run ./bench "$@"
