#!/usr/bin/env bash
# The benchmark's peers, each in its own venv outside the clone (idempotent; quick when done):
#   vllm-router and sglang-router (PyPI; Rust routers behind a Python launcher), Python 3.11
#   inference-perf (PyPI; an external load generator), Python >= 3.12 (pyenv's)
# Versions are pinned so that measured figures can be reproduced.
set -euo pipefail
peers="${PREFIX_ROUTER_PEERS:-$HOME/.cache/prefix-router/peers}"
mkdir -p "$peers"

python_at_least() { # $1: interpreter, $2: minor version of 3.x
    "$1" -c "import sys; sys.exit(0 if sys.version_info >= (3, $2) else 1)" 2>/dev/null
}

install() { # $1: venv name (= the command it provides), $2: pip requirement, $3: python
    local venv="$peers/$1" mark="$peers/$1/.installed-$2"
    [ -x "$venv/bin/$1" ] && [ -f "$mark" ] && return
    echo "installing $2 into $venv" >&2
    rm -rf "$venv"
    "$3" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$2"
    touch "$mark"
}

install vllm-router vllm-router==0.1.17 python3
install sglang-router sglang-router==0.3.2 python3

py312=""
for p in python3.12 python3.13 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python; do
    if command -v "$p" >/dev/null 2>&1 && python_at_least "$p" 12; then py312="$p"; break; fi
done
if [ -n "$py312" ]; then
    install inference-perf inference-perf==0.7.0 "$py312"
else
    echo "no Python >= 3.12 found: inference-perf not installed (its runs are skipped)" >&2
fi
