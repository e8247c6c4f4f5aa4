#!/usr/bin/env bash
# Builds the wasm filter (release profile "wasm", target wasm32-wasip1). It carries no model:
# Envoy serves it the model's tokenizer files at start (render-envoy-config --tokenizer-dir).
# Cached in target/: a no-op when nothing changed.
#
# The default build encodes the byte-level BPE vocabularies (GPT-2/SmolLM, Llama-3, Qwen2
# families) with this project's encoder and is under 2 MB. `--full` builds the filter with the
# `tokenizers` crate as well (about 4 MB), for any other `tokenizer.json` (SentencePiece-style
# Llama-2, Mistral, Gemma, …), and prints that file's path instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--full" ]; then
  cargo build -q --profile wasm -p prefix-router-filter --target wasm32-wasip1 \
    --features hf-tokenizers --target-dir target/wasm-full
  echo "target/wasm-full/wasm32-wasip1/wasm/prefix_router_filter.wasm"
  exit 0
fi
cargo build -q --profile wasm -p prefix-router-filter --target wasm32-wasip1
echo "target/wasm32-wasip1/wasm/prefix_router_filter.wasm"
