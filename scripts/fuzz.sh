#!/usr/bin/env bash
# Fuzzes every parser: the `fuzz` property tests of fedfuse-core, fedfuse-data and fedfuse-lab
# (arbitrary and mutated inputs, see crates/core/tests/core/fuzz.rs) with CASES cases per test,
# one parser at a time, then the cargo-fuzz targets (crates/{core,flower-node}/fuzz) where
# cargo-fuzz is installed. Prints per parser the cases run, failures (panics, or a heap peak
# over the parser's bound), the largest heap peak of one case and the process's peak RSS.
#
#   scripts/fuzz.sh [CASES] [PARSER...]
#
# CASES defaults to 1000000; PARSER is any of record flower node safetensors npz idx cifar csv
# cdc config (all by default; `node` is the Rust SuperNode's object assembly). The tests build in the test profile (dependencies optimised, overflow
# checks on); FUZZ_RELEASE=1 builds them optimised with overflow checks and debug assertions
# kept, in target/fuzz (a first build compiles every dependency again, burn's included).
# Exits non-zero when any parser fails.
set -euo pipefail
cd "$(dirname "$0")/.."

cases=${1:-1000000}
shift || true
all=(record flower node safetensors npz idx cifar csv cdc config)
if (($#)); then parsers=("$@"); else parsers=("${all[@]}"); fi

# parser -> package, test binary, test-name filters.
declare -A package=(
    [record]=fedfuse-core [flower]=fedfuse-core [node]=fedfuse-flower-node
    [safetensors]=fedfuse-core [npz]=fedfuse-core
    [idx]=fedfuse-data [cifar]=fedfuse-data [csv]=fedfuse-data [cdc]=fedfuse-data
    [config]=fedfuse-lab
)
declare -A binary=([fedfuse-core]=core [fedfuse-flower-node]=fuzz [fedfuse-data]=data
    [fedfuse-lab]=lab)
declare -A filters=(
    [record]="fuzz::record_ fuzz::sparse_record_"
    [flower]="fuzz::flower_"
    [node]="node_"
    [safetensors]="fuzz::safetensors_"
    [npz]="fuzz::npz_ fuzz::npy_"
    [idx]="fuzz::idx_"
    [cifar]="fuzz::cifar_"
    [csv]="fuzz::csv_"
    [cdc]="fuzz::cdc_"
    [config]="fuzz::config_"
)

profile=()
if [[ ${FUZZ_RELEASE:-0} == 1 ]]; then
    profile=(--profile fuzz
        --config 'profile.fuzz.inherits="release"'
        --config 'profile.fuzz.overflow-checks=true'
        --config 'profile.fuzz.debug-assertions=true')
fi

for p in "${parsers[@]}"; do
    [[ -n ${package[$p]:-} ]] || { echo "unknown parser '$p'; parsers: ${all[*]}" >&2; exit 2; }
done

# Each package's test binary, built once.
declare -A bin_of=()
for p in "${parsers[@]}"; do
    pkg=${package[$p]}
    [[ -z ${bin_of[$pkg]:-} ]] || continue
    echo "building the $pkg tests..." >&2
    bin_of[$pkg]=$(CARGO_INCREMENTAL=0 cargo test ${profile[@]+"${profile[@]}"} -p "$pkg" \
        --test "${binary[$pkg]}" --no-run --message-format=json |
        grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
    [[ -x ${bin_of[$pkg]} ]] || { echo "could not build the $pkg tests" >&2; exit 1; }
done

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=0
rows=()
for p in "${parsers[@]}"; do
    pkg=${package[$p]}
    bin=${bin_of[$pkg]}
    log=$logs/$p.log
    echo "fuzzing $p ($cases cases per test)..." >&2
    start=$(date +%s.%N)
    status=0
    # Run as cargo test does, from the package's folder.
    (
        cd "crates/${pkg#fedfuse-}"
        # shellcheck disable=SC2086 # the filters are words
        PROPTEST_CASES=$cases /usr/bin/time -f '%M' -o "$logs/$p.rss" \
            "$bin" ${filters[$p]} --nocapture >"$log" 2>&1
    ) || status=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    ran=$(sed -n 's/^fuzz [a-z_]*: \([0-9]*\) cases.*/\1/p' "$log" | awk '{n += $1} END {print n + 0}')
    heap=$(sed -n 's/.*heap peak \([0-9]*\) bytes.*/\1/p' "$log" | sort -n | tail -1)
    rss=$(tail -1 "$logs/$p.rss" 2>/dev/null | grep -o '^[0-9]*' || true)
    passed=$(grep -c '^test .* ok$' "$log" || true)
    fails=$(grep -c '^test .* FAILED$' "$log" || true)
    grep '^fuzz ' "$log" | sed 's/^/  /' >&2 || true
    if ((status != 0)); then
        failed=1
        ((fails > 0)) || fails="crashed (exit $status)"
        echo "---- $p: last lines of its log" >&2
        tail -40 "$log" >&2
    fi
    rows+=("$(printf '%-12s %12s %10s %8s %14s %12s %8s' "$p" "${ran:-0}" "$passed" \
        "$fails" "${heap:-0}" "${rss:-?}" "$secs")")
done

printf '\n%-12s %12s %10s %8s %14s %12s %8s\n' parser cases "tests ok" failures \
    "heap peak B" "max RSS KiB" seconds
printf '%s\n' "${rows[@]}"

# The cargo-fuzz targets (libFuzzer, nightly, coverage-guided): panics only; the property
# tests above check the heap bounds and round trips.
fuzz_targets=(core:record_decode core:npz_read core:safetensors_read core:flower_content
    flower-node:node_inflate)
if cargo +nightly fuzz --version >/dev/null 2>&1; then
    for t in "${fuzz_targets[@]}"; do
        echo "cargo-fuzz: ${t#*:}, $cases runs" >&2
        (cd "crates/${t%%:*}/fuzz" && cargo +nightly fuzz run "${t#*:}" -- -runs="$cases") ||
            failed=1
    done
else
    echo "cargo-fuzz targets (${fuzz_targets[*]}): skipped (needs cargo install cargo-fuzz" \
        "and a nightly toolchain); the property tests above cover the same parsers" >&2
fi
exit $failed
