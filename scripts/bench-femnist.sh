#!/usr/bin/env bash
# FEMNIST at its real client count: a federation of 3,597 writers (synthetic shards in LEAF's
# layout, scripts/make-femnist-leaf.py), LeNet-5 as experiments/fedsparse-femnist-lenet5.toml
# trains it, 10 writers a round. Prints the reading time, the time per round and the peak
# memory (docs/BENCHMARKS.md, "FEMNIST").
#   bash scripts/bench-femnist.sh [FEDFUSE] [WRITERS] [TRAIN_PER_WRITER]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/fedfuse}
writers=${2:-3597}
per=${3:-20}
data=target/bench-femnist/leaf-$writers-$per
if [ ! -d "$data/train" ]; then
    bash scripts/flower-venv.sh
    target/flower-venv/bin/python scripts/make-femnist-leaf.py "$data" --writers "$writers" \
        --train "$per" --test 3
fi
cfg=target/bench-femnist/run.toml
cat > "$cfg" <<TOML
seed = 1
rounds = 20
clients = $writers
clients_per_round = 10
eval_every = 20
[dataset]
name = "femnist"
[partition]
kind = "natural_id"
column = "writer_id"
[method]
name = "fedavg"
[model]
kind = "lenet5"
[train]
lr = 0.05
batch_size = 20
TOML
rm -rf target/bench-femnist/out target/bench-femnist/out.checkpoint*
/usr/bin/time -v "$bin" run "$cfg" --data-dir "$data" --out target/bench-femnist/out --quiet \
    2>target/bench-femnist/log || { cat target/bench-femnist/log; exit 1; }
grep -E "^round|Maximum resident|Elapsed" target/bench-femnist/log
