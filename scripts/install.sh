#!/usr/bin/env bash
# Installs prefix-router's configuration tool and filter for use outside this checkout:
#   render-envoy-config        -> $PREFIX/bin (default ~/.local/bin), by cargo install
#   prefix_router_filter.wasm  -> ${XDG_DATA_HOME:-~/.local/share}/prefix-router/, where
#                                 render-envoy-config looks when --wasm is not given
#   the default model's tokenizer files -> …/prefix-router/models/SmolLM2-135M-Instruct/,
#                                 where it looks when --tokenizer-dir is not given
# Then: render-envoy-config --config gateway.yaml -o envoy.yaml (anywhere).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-$HOME/.local}
DATA=${XDG_DATA_HOME:-$HOME/.local/share}/prefix-router
# the dev profile (optimised where it matters, no LTO: a renderer needs none) and the
# checkout's target/, so a built tree installs in seconds
cargo install --quiet --locked --debug --path config-tool --root "$PREFIX" --target-dir target
wasm=$(scripts/build-filter.sh)
mkdir -p "$DATA"
cp "$wasm" "$DATA/"
model=SmolLM2-135M-Instruct
src=${PREFIX_ROUTER_DATA:-data}/models/$model
mkdir -p "$DATA/models/$model"
cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$DATA/models/$model/"
echo "installed $PREFIX/bin/render-envoy-config, $DATA/$(basename "$wasm") and $DATA/models/$model/"

