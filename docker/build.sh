#!/usr/bin/env bash
# Build qserve's images: docker/build.sh [serve] [toolkit]   (what `make image` runs; docs/deploy.md)
# Env: IMAGE (name, default qserve: tags IMAGE:serve, IMAGE:toolkit), BASE (default python:3.11-slim-bookworm when
# docker can pull it, else a Debian base made here by docker/base.sh), TORCH_INDEX (the toolkit's torch; default
# PyTorch's CPU index, or none where this machine's pip finds a local torch wheel), DOCKER_NETWORK (default host).
# This machine's pip settings (pip.conf's index and CA bundle, constraints) go to docker/pip/ for the throwaway
# build stage only.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("${@:-serve toolkit}")
read -r -a targets <<<"${targets[*]}"
image=${IMAGE:-qserve}
network=${DOCKER_NETWORK:-host}
command -v docker >/dev/null || { echo "make image needs docker (Debian: apt-get install docker.io)" >&2; exit 2; }

base=${BASE:-}
if [ -z "$base" ]; then
  if docker image inspect python:3.11-slim-bookworm >/dev/null 2>&1 \
     || timeout 60 docker pull -q python:3.11-slim-bookworm >/dev/null 2>&1; then
    base=python:3.11-slim-bookworm
  else
    base=qserve-base:bookworm
    if ! docker image inspect "$base" >/dev/null 2>&1; then
      echo "python:3.11-slim-bookworm cannot be pulled here: making $base with debootstrap" >&2
      docker/base.sh "$base"
    fi
  fi
fi

# docker/pip: what pip uses on this machine, for the build stage (never copied into an image)
find docker/pip -mindepth 1 ! -name README.md ! -name env.sh -exec rm -rf {} +
conf=$(mktemp)
trap 'rm -f "$conf"' EXIT
{
  echo "[global]"
  pip3 config list 2>/dev/null | sed -n "s/^global\.\(index-url\|extra-index-url\|trusted-host\)='\(.*\)'$/\1 = \2/p" \
    | grep -v "file://" || true
  if [ -f "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" ]; then
    cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" docker/pip/ca.crt && echo "cert = /pip/ca.crt"
  fi
  if [ -f /etc/xdg/pip/constraints.txt ]; then cp /etc/xdg/pip/constraints.txt docker/pip/ && echo "constraint = /pip/constraints.txt"; fi
  echo "find-links = /pip/wheels"  # docker/pip/wheels: a local torch build, staged for the toolkit only
} >"$conf"
cp "$conf" docker/pip/pip.conf
torch_index=${TORCH_INDEX-}
if [[ " ${targets[*]} " == *" toolkit "* ]]; then
  mkdir -p docker/pip/wheels
  for dir in ${PIP_FIND_LINKS:-} $(pip3 config get global.find-links 2>/dev/null || true); do
    [ -d "$dir" ] && { ln -f "$dir"/torch-2.13.0*.whl docker/pip/wheels/ 2>/dev/null || cp "$dir"/torch-2.13.0*.whl docker/pip/wheels/ 2>/dev/null || true; }
  done
  if compgen -G "docker/pip/wheels/torch-*.whl" >/dev/null; then
    torch_index=${TORCH_INDEX-none}  # the local CPU build, not an index
  fi
fi

version=$(python3 -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
for target in "${targets[@]}"; do
  args=(--network "$network" -f docker/Dockerfile --target "$target" -t "$image:$target"
        --build-arg "BASE=$base" --build-arg "VERSION=$version" --build-arg "REVISION=$revision")
  if [ "$torch_index" = none ]; then args+=(--build-arg TORCH_INDEX=); elif [ -n "$torch_index" ]; then
    args+=(--build-arg "TORCH_INDEX=$torch_index"); fi
  echo "building $image:$target on $base" >&2
  docker build "${args[@]}" .
done
