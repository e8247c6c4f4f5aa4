#!/usr/bin/env bash
# Builds the three images the Kubernetes overlays run (prefix-router/filter, model-server,
# kv-events; tag 0.1.0) from binaries built here on the host, then loads them where a local
# cluster can pull them: CONTAINER=podman|docker (default: whichever is installed);
# LOAD=kind|minikube|none (default none: push them to your registry yourself).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${TAG:-0.1.0}
CONTAINER=${CONTAINER:-$(command -v podman >/dev/null && echo podman || echo docker)}
cargo build --release -p model-server -p kv-events --bins
scripts/build-filter.sh >/dev/null
scripts/fetch-model.sh
for image in filter model-server kv-events; do
  "$CONTAINER" build -f "deploy/images/$image.Containerfile" -t "prefix-router/$image:$TAG" .
  case "${LOAD:-none}" in
    kind) kind load docker-image "prefix-router/$image:$TAG" ;;
    minikube) minikube image load "prefix-router/$image:$TAG" ;;
    none) ;;
    *) echo "LOAD must be kind, minikube or none" >&2; exit 2 ;;
  esac
done
echo "built prefix-router/{filter,model-server,kv-events}:$TAG"
