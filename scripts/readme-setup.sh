#!/usr/bin/env bash
# Runs the README's set-up commands exactly as README.md writes them, so the text a newcomer
# copies and the commands CI runs cannot drift apart.
#
#   scripts/readme-setup.sh main    # command 1, then checks what the README says it leaves
#   scripts/readme-setup.sh tests   # command 2 (the test command)
#   scripts/readme-setup.sh print   # both, as extracted
#
# The commands are the non-comment lines of the first ```sh block under "## Set-up: two
# commands"; there must be exactly two. Run from a clean clone, command 1 writes into folders
# that do not exist yet, as it does for a newcomer.
set -euo pipefail
cd "$(dirname "$0")/.."
readme=README.md

commands=$(awk '
    /^## Set-up: two commands/ { section = 1; next }
    section && /^## / { exit }
    section && !block && /^```sh/ { block = 1; next }
    block && /^```/ { exit }
    block && !/^[[:space:]]*(#|$)/ { print }
' "$readme")
count=$(printf '%s\n' "$commands" | grep -c . || true)
if [ "$count" -ne 2 ]; then
    echo "$readme: the set-up block must hold exactly two commands, found $count:" >&2
    printf '%s\n' "$commands" >&2
    exit 1
fi
main=$(printf '%s\n' "$commands" | sed -n 1p)
tests=$(printf '%s\n' "$commands" | sed -n 2p)

timed() {
    local started=$SECONDS
    echo "+ $1"
    bash -euo pipefail -c "$1"
    echo "README command took $((SECONDS - started)) s: $1"
}

case "${1:-}" in
print)
    printf '%s\n%s\n' "$main" "$tests"
    ;;
tests)
    timed "$tests"
    ;;
main)
    out=$(printf '%s\n' "$main" | sed -n 's/.*--out[ =]\([^ ]*\).*/\1/p')
    if [ -z "$out" ]; then
        echo "$readme: command 1 names no --out folder: $main" >&2
        exit 1
    fi
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    timed "$main" 2>&1 | tee "$log"
    # The README: "ends near 0.94 global accuracy".
    acc=$(sed -n 's/^final global accuracy \([0-9.]*\);.*/\1/p' "$log" | tail -n 1)
    if [ -z "$acc" ]; then
        echo "command 1 did not end with its final-accuracy line" >&2
        exit 1
    fi
    if ! awk -v a="$acc" 'BEGIN { exit !(a >= 0.90) }'; then
        echo "command 1 ended at global accuracy $acc; the README promises near 0.94" >&2
        exit 1
    fi
    # The files the README says the folder then holds: the backquoted file names of the
    # paragraph after the block (`accuracy_vs_round.{png,svg}` expands to two).
    listed=$(awk '
        /^The first prints/ { on = 1 }
        on && /^$/ { exit }
        on { print }
    ' "$readme" | grep -o '`[A-Za-z_]*\.[A-Za-z{},]*`' | tr -d '`')
    files=()
    for name in $listed; do
        for f in $(eval "echo $name"); do files+=("$f"); done
    done
    if [ "${#files[@]}" -lt 8 ]; then
        echo "$readme: expected the paragraph after the set-up block to list the run's files," \
            "found: ${files[*]:-none}" >&2
        exit 1
    fi
    for f in "${files[@]}"; do
        if [ ! -s "$out/$f" ]; then
            echo "command 1 left no $out/$f, which the README lists" >&2
            exit 1
        fi
    done
    echo "README command 1: final global accuracy $acc; $out holds ${files[*]}"
    ;;
*)
    echo "usage: $0 main|tests|print" >&2
    exit 2
    ;;
esac
