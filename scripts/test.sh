#!/usr/bin/env bash
# The whole test suite: what CI runs (.ci/run calls exactly this).
# Installs what is missing (scripts/setup.sh), then: rustfmt check, clippy -D warnings, core
# builds for wasm32, every test (including the ones that start real processes), and both demo
# scripts (scripts/demo.sh all, with the project's pods and with llama.cpp pods).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
disk() { echo "== disk: target/ $(du -sh target 2>/dev/null | cut -f1), free $(df -h --output=avail . | tail -1 | tr -d ' ')"; }
disk
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets -q -- -D warnings
echo "== prefix-core builds for wasm32"
# wasm32-wasip1: built for real below, as part of the filter (scripts/build-filter.sh).
# wasm32-unknown-unknown has no OS randomness; tokenizers' hash seeds use getrandom, whose
# "custom" backend lets the embedding binary supply it. Type-check that target too.
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS='--cfg getrandom_backend="custom"' \
  cargo check -q -p prefix-core --target wasm32-unknown-unknown
echo "== the engine and the model server type-check for aarch64 (the engine's portable path; no AVX there)"
RUSTFLAGS='-D warnings' cargo check -q -p gguf-engine -p model-server --target aarch64-unknown-linux-gnu
echo "== build binaries the real-process tests start (model-server, kv-events, wasm filter)"
# the same selection as scripts/demo.sh and the README's by-hand build: a different one would
# resolve other features for shared dependencies and compile the engine's chain again
cargo build -q -p model-server -p kv-events -p prefix-router-config --bins
scripts/build-filter.sh
scripts/build-filter.sh --full >/dev/null # the filter for any tokenizer.json (tokenizer_source.rs)
disk
echo "== tests"
status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast || status=$?
else
  cargo test --workspace --no-fail-fast || status=$?
fi
echo "== the demo scripts, as a user runs them (the README's first command; every scenario on the sim engine for speed; then llama.cpp and vLLM pods)"
scripts/demo.sh >target/demo-seed.log 2>&1 || { status=1; tail -20 target/demo-seed.log; echo "demo failed (the README's first command)"; }
ENGINE=sim scripts/demo.sh all >target/demo-model-server.log 2>&1 || { status=1; tail -20 target/demo-model-server.log; echo "demo failed (model-server pods)"; }
BACKEND=llama-cpp scripts/demo.sh all >target/demo-llama-cpp.log 2>&1 || { status=1; tail -20 target/demo-llama-cpp.log; echo "demo failed (llama.cpp pods)"; }
BACKEND=vllm scripts/demo.sh all >target/demo-vllm.log 2>&1 || { status=1; tail -20 target/demo-vllm.log; echo "demo failed (vLLM pods)"; }
echo "== the README's install step, into target/ (the installed tool then renders from anywhere)"
(
  export PREFIX=$PWD/target/install XDG_DATA_HOME=$PWD/target/install/share
  scripts/install.sh
  cd /tmp && "$PREFIX/bin/render-envoy-config" --pods 127.0.0.1:8001 >/dev/null
) >target/install.log 2>&1 || { status=1; cat target/install.log; echo "install step failed"; }
disk
exit "$status"
