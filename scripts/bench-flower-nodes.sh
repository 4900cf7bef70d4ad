#!/usr/bin/env bash
# Rust SuperNodes against Python SuperNodes under Flower's own FedAvg, with a release build of
# the fedfuse binary (docs/BENCHMARKS.md, "fedfuse flower-node"). Arguments go to
# scripts/bench-flower-nodes.py (--nodes, --rounds). About 15 minutes on 2 cores with 20 nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/flower-venv.sh
cargo build --release -p fedfuse --bin fedfuse --locked --quiet
target/flower-venv/bin/python scripts/bench-flower-nodes.py "$@"
