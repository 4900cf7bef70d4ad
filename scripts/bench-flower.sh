#!/usr/bin/env bash
# fedfuse on Flower, measured with a release build of the Python module (docs/BENCHMARKS.md,
# "fedfuse on Flower"). Arguments go to scripts/bench-flower.py (--skip-deployment, --repeats).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/flower-venv.sh
# The workspace's debug build for the fedfuse binary and examples the deployment runs.
cargo build --workspace --all-targets --locked --quiet
cargo build --release -p fedfuse-py --locked --quiet
stage=target/python-release
rm -rf "$stage"
mkdir -p "$stage/fedfuse"
cp python/fedfuse/*.py python/fedfuse/py.typed "$stage/fedfuse/"
cp target/release/libfedfuse_py.so "$stage/fedfuse/_core.abi3.so"
# PYTHONPATH comes before the venv's .pth entry for the debug staging.
PYTHONPATH="$(pwd)/$stage" target/flower-venv/bin/python scripts/bench-flower.py "$@"
