#!/usr/bin/env bash
# Builds the wasm filter (release profile "wasm", target wasm32-wasip1). It carries no model:
# Envoy serves it the model's tokenizer files at start (render-envoy-config --tokenizer-dir).
# Cached in target/: a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --profile wasm -p prefix-router-filter --target wasm32-wasip1
echo "target/wasm32-wasip1/wasm/prefix_router_filter.wasm"
