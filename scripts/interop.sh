#!/usr/bin/env bash
# Interop check with Python's `safetensors` (installed here, in a venv under target/).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/interop-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy safetensors
# The same build as `cargo test --workspace` (a plain `-p fedfuse` build unifies features
# differently and would rebuild burn): it leaves target/debug/fedfuse.
cargo test --workspace --no-run --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
target/debug/fedfuse run examples/quickstart.toml --out "$out/run" --quiet 2>/dev/null
"$venv/bin/python" scripts/interop_check.py "$out/run"
