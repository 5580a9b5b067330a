#!/usr/bin/env bash
# Make a Debian bookworm base image with Python 3.11 from Debian's packages, for machines where docker cannot pull
# (no image registry): debootstrap a minimal root, drop apt's caches and the docs, `docker import` it.
#   docker/base.sh qserve-base:bookworm [MIRROR]
# `make image` runs it when no BASE is given and python:3.11-slim-bookworm cannot be pulled.
set -euo pipefail
tag=${1:?usage: docker/base.sh TAG [MIRROR]}
mirror=${2:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}
mirror=${mirror:-http://deb.debian.org/debian}
for tool in debootstrap docker; do
  command -v "$tool" >/dev/null || { echo "docker/base.sh needs $tool (Debian: apt-get install debootstrap docker.io)" >&2; exit 2; }
done
root=$(mktemp -d /tmp/qserve-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
# python3-venv: the build stage makes the venv with it; passwd: useradd for the non-root user
debootstrap --variant=minbase --include=python3,python3-venv,passwd,ca-certificates bookworm "$root" "$mirror" >/dev/null
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
  "$root"/usr/share/locale/* "$root"/usr/share/info/* "$root"/var/log/*
tar -C "$root" -c . | docker import -c 'CMD ["/bin/bash"]' -m "debootstrap --variant=minbase bookworm + python3" - "$tag"
