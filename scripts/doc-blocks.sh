#!/usr/bin/env bash
# Runs the guides' shell blocks as docs/guides/*.md write them, so the commands a reader copies
# and the commands CI runs cannot drift apart (as scripts/readme-setup.sh does for the README's
# set-up and python/tests/test_docs.py for docs/FLOWER.md's recipes).
#
#   scripts/doc-blocks.sh              # check the markers, then run every doc-test block
#   scripts/doc-blocks.sh check        # only check the markers
#   scripts/doc-blocks.sh list         # the blocks' names, by guide
#   scripts/doc-blocks.sh run NAME...  # run these blocks only
#
# Every ```sh block of a guide follows, on the line before it, either
# `<!-- doc-test: NAME -->` (run here) or `<!-- not run: REASON -->` (it needs the internet or
# hours): a block marked neither fails the check, so none escapes unnoticed.
#
# Each block runs with `bash -euo pipefail` from the root of a fresh copy of the tree (the
# files git tracks, and untracked ones it does not ignore: no .git, no target, no runs), whose
# `../shared` is this checkout's, with a folder holding only `fedfuse` first on PATH: the
# binary $FEDFUSE (default target/debug/fedfuse, which the README's command 1 builds).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
guides=(docs/guides/*.md)
# Seconds one block may take (the whole run takes about a minute; see docs/LAYOUT.md).
limit=${DOC_BLOCK_LIMIT:-300}

# NAME<TAB>GUIDE for every doc-test block; fails on a block with no marker or a repeated name.
blocks() {
    awk '
        FNR == 1 { prev = "" }
        /^```/ {
            if (!fence) {
                fence = 1
                if ($0 ~ /^```(sh|bash|shell|console)[[:space:]]*$/) {
                    if (prev ~ /^<!-- doc-test: [A-Za-z0-9_-]+ -->$/) {
                        name = prev; sub(/^<!-- doc-test: /, "", name); sub(/ -->$/, "", name)
                        if (name in seen) {
                            printf "%s:%d: the doc-test name %s is taken (%s)\n", FILENAME, FNR, name, seen[name] > "/dev/stderr"
                            bad = 1
                        }
                        seen[name] = FILENAME
                        print name "\t" FILENAME
                    } else if (prev !~ /^<!-- not run: .+ -->$/) {
                        printf "%s:%d: a shell block needs <!-- doc-test: NAME --> or <!-- not run: REASON --> on the line before it\n", FILENAME, FNR > "/dev/stderr"
                        bad = 1
                    }
                }
            } else {
                fence = 0
            }
        }
        { prev = $0 }
        END { exit bad }
    ' "${guides[@]}"
}

# The body of block NAME in GUIDE.
body() {
    awk -v want="<!-- doc-test: $1 -->" '
        $0 == want { found = 1; next }
        found && !inside && /^```/ { inside = 1; next }
        inside && /^```/ { exit }
        inside { print }
    ' "$2"
}

run_block() {
    local name=$1 guide=$2 fedfuse=$3 work
    work=$(mktemp -d)
    # The copy sits at $work/repo, with $work/shared standing for ../shared.
    mkdir -p "$work/repo" "$work/bin"
    if [ -d "$root/../shared" ]; then
        ln -s "$(cd "$root/../shared" && pwd)" "$work/shared"
    fi
    if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$root" ls-files -z --cached --others --exclude-standard |
            (cd "$root" && xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
            tar -C "$root" --null -T - -cf - | tar -C "$work/repo" -xf -
    else
        tar -C "$root" --exclude=./.git --exclude=./target --exclude=./runs -cf - . |
            tar -C "$work/repo" -xf -
    fi
    ln -s "$fedfuse" "$work/bin/fedfuse"
    body "$name" "$guide" >"$work/block.sh"
    local started=$SECONDS status=0
    echo "--- doc-test $name ($guide)"
    (cd "$work/repo" && PATH="$work/bin:$PATH" timeout "$limit" bash -euo pipefail "$work/block.sh") ||
        status=$?
    echo "doc-test $name: $((SECONDS - started)) s"
    rm -rf "$work"
    if [ "$status" -ne 0 ]; then
        echo "doc-test $name ($guide) failed with status $status" >&2
        return 1
    fi
}

list=$(blocks)
case "${1:-all}" in
check)
    echo "$(printf '%s\n' "$list" | grep -c .) doc-test blocks in ${#guides[@]} guides, every shell block marked"
    exit 0
    ;;
list)
    printf '%s\n' "$list"
    exit 0
    ;;
run)
    shift
    names=("$@")
    ;;
all)
    mapfile -t names < <(printf '%s\n' "$list" | cut -f1)
    ;;
*)
    echo "usage: $0 [check|list|run NAME...]" >&2
    exit 2
    ;;
esac

fedfuse=${FEDFUSE:-$root/target/debug/fedfuse}
fedfuse=$(cd "$(dirname "$fedfuse")" && pwd)/$(basename "$fedfuse")
if [ ! -x "$fedfuse" ]; then
    echo "no fedfuse binary at $fedfuse: build it (cargo build --bin fedfuse) or set FEDFUSE" >&2
    exit 1
fi
started=$SECONDS
for name in "${names[@]}"; do
    guide=$(printf '%s\n' "$list" | awk -F '\t' -v n="$name" '$1 == n { print $2 }')
    if [ -z "$guide" ]; then
        echo "no doc-test block named $name" >&2
        exit 1
    fi
    run_block "$name" "$guide" "$fedfuse"
done
echo "doc-test blocks: ${#names[@]} passed in $((SECONDS - started)) s"
