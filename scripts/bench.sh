#!/usr/bin/env bash
# Benchmarks: printed and written to bench-results/<timestamp>/ (results.json, results.csv,
# traces, plots); never asserted in tests. Release builds; load goes to 127.0.0.1 only and
# every run is bounded in count and time.
#   scripts/bench.sh --quick          policies side by side, ≤ 2 minutes
#   scripts/bench.sh                  policies, full (≤ 10 minutes; includes filter overhead)
#   scripts/bench.sh cache|filter|engine   cache/tokenizer/server, filter overhead, real-engine TTFT
#   scripts/bench.sh hostile              hostile requests (huge words, batches, deep JSON, …)
#                                         through Envoy and at a pod, each timed
#   scripts/bench.sh faults [--quick]     pod kill/restart/join under 50 req/s, 100k unique
#                                         prompts, 10-minute soak with kills (quick: ~3 min)
#   scripts/bench.sh vllm [--quick]      prefix routing on 3 real vLLM pods, events on and
#                                         off, beside round robin and the peers (~10 min)
#   scripts/bench.sh --repeat 3 --only long-prefix-saturated,ip-long-prefix
#                                     several runs of chosen workloads: medians and ranges,
#                                     the goals read from the medians
#   scripts/bench.sh --help           every option (pods, rate, requests, workloads, seed, …)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null  # includes the peers (scripts/install-peers.sh)
cargo build -q --release -p model-server -p prefix-router-bench --bins
cargo build -q -p kv-events --bins # the vLLM pods' sidecars (test-harness starts the debug build)
scripts/build-filter.sh >/dev/null
# the floor row of the filter overhead: a wasm filter that only reads the body
cargo build -q --profile wasm -p prefix-router-floor-filter --target wasm32-wasip1
out="bench-results/$(date +%Y%m%d-%H%M%S)"
export MODEL_SERVER_BIN="$PWD/target/release/model-server"
exec target/release/bench "$@" --out "$out"
