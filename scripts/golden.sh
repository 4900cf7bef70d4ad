#!/usr/bin/env bash
# Rewrites crates/lab/tests/golden/ from a fedfuse binary (default: a fresh release build), for
# a change that is meant to alter results. Review the diff before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
    cargo build --release -p fedfuse --quiet
    bin=target/release/fedfuse
fi
gold=crates/lab/tests/golden
# The files are bit-exact only on the gemm kernels they were written on (golden.rs).
"$bin" --version | sed -n 's/.*(gemm kernels: \(.*\))$/\1/p' > "$gold/KERNELS"
[ -s "$gold/KERNELS" ] || { echo "golden.sh: no gemm kernels in \`$bin --version\`" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -v '^#' "$gold/cases.txt" | while IFS='|' read -r name cmd file sets; do
    name=$(echo "$name" | xargs); cmd=$(echo "$cmd" | xargs); file=$(echo "$file" | xargs)
    args=()
    IFS=';' read -ra parts <<< "$sets"
    for p in "${parts[@]}"; do
        p=$(echo "$p" | sed 's/^ *//; s/ *$//')
        [ -z "$p" ] && continue
        case "$p" in
            seeds=*) args+=(--seeds "${p#seeds=}") ;;
            *) args+=(--set "$p") ;;
        esac
    done
    [ "$cmd" = run ] && args+=(--quiet)
    FEDFUSE_DATA="$tmp/no-cache" "$bin" "$cmd" "$file" --out "$tmp/$name" "${args[@]}" >/dev/null 2>&1
    mkdir -p "$gold/$name"
    for f in results.json metrics.csv results.csv summary.csv; do
        [ -f "$tmp/$name/$f" ] && cp "$tmp/$name/$f" "$gold/$name/$f"
    done
    if [ -f "$tmp/$name/model.safetensors" ]; then
        sha256sum "$tmp/$name/model.safetensors" | cut -d' ' -f1 > "$gold/$name/model.sha256"
    fi
    echo "$name"
done
