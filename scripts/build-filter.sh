#!/usr/bin/env bash
# Builds the wasm filter (release profile "wasm", target wasm32-wasip1). It carries no model:
# Envoy serves it the model's tokenizer files at start (render-envoy-config --tokenizer-dir).
# Cached in target/: a no-op when nothing changed.
#
# The default build encodes the byte-level BPE vocabularies (GPT-2/SmolLM, Llama-3, Qwen2
# families) with this project's encoder and is under 2 MB. `--full` also builds the filter
# with the `tokenizers` crate inside (about 4 MB), for any other `tokenizer.json`
# (SentencePiece-style Llama-2, Mistral, Gemma, …), and prints that file's path instead.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/wasm32-wasip1/wasm
build() { cargo build -q --profile wasm -p prefix-router-filter --target wasm32-wasip1 "$@"; }
if [ "${1:-}" = "--full" ]; then
  # same target directory: only prefix-core, the tokenizers crate and the filter differ
  build --features hf-tokenizers
  cp "$out/prefix_router_filter.wasm" "$out/prefix_router_filter_full.wasm.tmp"
  mv "$out/prefix_router_filter_full.wasm.tmp" "$out/prefix_router_filter_full.wasm"
  build # the default file back in place (nothing to compile)
  echo "$out/prefix_router_filter_full.wasm"
  exit 0
fi
build
echo "$out/prefix_router_filter.wasm"
