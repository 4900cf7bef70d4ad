#!/usr/bin/env bash
# The benchmarks of docs/BENCHMARKS.md. Usage: scripts/bench.sh [MNIST_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
mnist=${1:-../shared/data/mnist}
python3 -c "import numpy" 2>/dev/null || python3 -m pip install --quiet numpy
cargo build --release -p fedfuse
bin=target/release/fedfuse
echo "== local training, one thread"
$bin bench train --data-dir "$mnist" --repeats 5 --threads 1
OPENBLAS_NUM_THREADS=1 python3 scripts/bench_numpy_mlp.py "$mnist" 5
echo "== simulation"
$bin bench sim --clients 1000 --rounds 3 --step add
$bin bench sim --clients 1000 --rounds 3 --step sgd
$bin bench sim --clients 10000 --rounds 2 --step add
