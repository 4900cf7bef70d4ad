#!/usr/bin/env bash
# The Python package's tests: fuse() against `fedfuse fuse`, Flower records, and a real Flower
# deployment on 127.0.0.1 (SuperLink + 10 SuperNodes, about 4 minutes). Installs the pinned
# venv (scripts/flower-venv.sh) and stages the workspace's debug build into it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/python-dev.sh
target/flower-venv/bin/python -m pytest python/tests -q "$@"
