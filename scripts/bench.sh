#!/usr/bin/env bash
# Benchmarks (printed and written to bench-results/<timestamp>/; never asserted in tests).
#   scripts/bench.sh [cache|filter|all] [--seconds N] [--connections N]
# Release builds; load goes to 127.0.0.1 only and every run is bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
cargo build -q --release -p model-server -p test-harness --bins
scripts/build-filter.sh >/dev/null
out="bench-results/$(date +%Y%m%d-%H%M%S)"
export MODEL_SERVER_BIN="$PWD/target/release/model-server"
exec target/release/bench "$@" --out "$out"
