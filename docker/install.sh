#!/bin/sh
# Install qserve (/src) into the build stage's venv, whose dependencies are in place; compile the bytecode of what a
# serving start imports (precompile.py); put every file this added under /stage. The final stage copies the
# dependencies' venv (a layer kept while pyproject.toml is unchanged) and then /stage, so a change to qserve rebuilds
# a layer of a few MB, not the whole venv's. docker/Dockerfile runs it in build-serve and build-toolkit.
set -eu
. /pip/env.sh
find /opt/qserve \( -type f -o -type l \) | sort >/pip/before
/opt/qserve/bin/pip install --quiet --no-deps --no-compile /src
/opt/qserve/bin/python /pip/precompile.py
find /opt/qserve \( -type f -o -type l \) | sort >/pip/after
mkdir -p /stage
comm -13 /pip/before /pip/after | xargs -d '\n' cp -a --parents -t /stage
