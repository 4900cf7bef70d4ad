#!/usr/bin/env bash
# PFNM over the permutation groups of residual networks (docs/BENCHMARKS.md, "PFNM of residual
# networks"): two ResNet-18-sized networks (the second A with every group permuted and 5 %
# noise), eight ResNet-20s at width 16 (A and seven such copies) and two ResNet-50-sized
# networks of bottlenecks, each fused RUNS times by
# `fedfuse fuse --method pfnm` under /usr/bin/time; prints the median wall seconds, the median
# peak resident memory and the fused widths. No reference implementation matches residual
# networks by PFNM, so there is no ratio. Usage: scripts/bench_pfnm_resnets.sh [RUNS] [BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-9}
bin=${2:-}
venv=target/wm-venv
if [ ! -x $venv/bin/python ]; then
    python3 -m venv $venv
    $venv/bin/pip install --quiet numpy==2.3.5 scipy==1.16.3 safetensors==0.7.0
fi
py=$venv/bin/python
if [ -z "$bin" ]; then
    cargo build --release -p fedfuse
    bin=target/release/fedfuse
fi
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
[ -f target/wm/r18/b.safetensors ] || $py scripts/bench_weight_matching.py make target/wm/r18 --resnet18
[ -f target/wm/r20w16x8/b7.safetensors ] ||
    $py scripts/bench_weight_matching.py make target/wm/r20w16x8 --width 16 --copies 7
[ -f target/wm/r50/b.safetensors ] || $py scripts/bench_weight_matching.py make target/wm/r50 --resnet50
for d in target/wm/r18 target/wm/r20w16x8 target/wm/r50; do
    files=("$d/a.safetensors" "$d/b.safetensors")
    for f in "$d"/b[0-9]*.safetensors; do
        [ -e "$f" ] && files+=("$f")
    done
    cmd=("$bin" fuse "${files[@]}" --model "$d/model.toml" --method pfnm --out "$d/pfnm.safetensors")
    "${cmd[@]}" 2>&1 | grep -o 'widths .* ->.*\] ' | head -n 1
    : >"$d/times-pfnm"
    for _ in $(seq "$runs"); do
        /usr/bin/time -f "%e %M" -a -o "$d/times-pfnm" "${cmd[@]}" >/dev/null 2>&1
    done
    wall=$(cut -d' ' -f1 "$d/times-pfnm" | median)
    mem=$(cut -d' ' -f2 "$d/times-pfnm" | median)
    echo "$d: ${#files[@]} clients, median ${wall} s, peak $((mem / 1024)) MiB over $runs runs"
done
