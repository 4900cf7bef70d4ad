#!/usr/bin/env bash
# Weight matching of residual networks, fedfuse against the numpy reference
# (scripts/bench_weight_matching.py; docs/BENCHMARKS.md, "Weight matching of residual
# networks against numpy"). Usage: scripts/bench_weight_matching.sh [RUNS] [MODEL...]
#
# Makes the test models under target/wm (MODEL: r20w16 and r20w64, ResNet-20 at widths 16 and
# 64; r18, a ResNet-18-sized list; r50, a ResNet-50-sized one of bottlenecks; all but r50 by
# default; B is A with every permutation group permuted and 5 % noise), checks that both
# implementations recover the planted permutations with equal fused tensors, then runs each
# pair RUNS times in turn (fedfuse, reference, fedfuse, ...) under /usr/bin/time and prints
# the median wall seconds and the median peak resident memory of each.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-9}
shift || true
models=("${@:-r20w16 r20w64 r18}")
venv=target/wm-venv
if [ ! -x $venv/bin/python ]; then
    python3 -m venv $venv
    $venv/bin/pip install --quiet numpy==2.3.5 scipy==1.16.3 safetensors==0.7.0
fi
py=$venv/bin/python
cargo build --release -p fedfuse
bin=target/release/fedfuse
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
declare -A how=([r20w16]="--width 16" [r20w64]="--width 64" [r18]=--resnet18 [r50]=--resnet50)
for model in ${models[*]}; do
    d=target/wm/$model
    set -- ${how[$model]}
    $py scripts/bench_weight_matching.py make "$d" "$@"
    ours=("$bin" fuse "$d/a.safetensors" "$d/b.safetensors" --model "$d/model.toml"
        --method weight-matching --out "$d/fedfuse.safetensors")
    ref=("$py" scripts/bench_weight_matching.py fuse "$d/a.safetensors" "$d/b.safetensors"
        --model "$d/model.toml" --out "$d/reference.safetensors")
    "${ours[@]}" 2>/dev/null
    "${ref[@]}" 2>/dev/null
    $py scripts/bench_weight_matching.py check --model "$d/model.toml" \
        --planted "$d/planted.json" --fedfuse "$d/fedfuse.safetensors" \
        --reference "$d/reference.safetensors"
    : >"$d/times-fedfuse" && : >"$d/times-reference"
    for _ in $(seq "$runs"); do
        /usr/bin/time -f "%e %M" -a -o "$d/times-fedfuse" "${ours[@]}" 2>/dev/null
        /usr/bin/time -f "%e %M" -a -o "$d/times-reference" "${ref[@]}" 2>/dev/null
    done
    for who in fedfuse reference; do
        wall=$(cut -d' ' -f1 "$d/times-$who" | median)
        kib=$(cut -d' ' -f2 "$d/times-$who" | median)
        echo "$d $who: median wall ${wall} s, median peak RSS $((kib / 1024)) MiB ($runs runs)"
    done
done
