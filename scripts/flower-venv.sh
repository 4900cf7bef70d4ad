#!/usr/bin/env bash
# Creates (or refreshes) the Python venv used for Flower interop work at target/flower-venv,
# with pinned versions. Idempotent: a stamp file inside the venv records the pinned list and
# the interpreter version; a re-run with nothing changed returns at once.
# Usage: scripts/flower-venv.sh   (then use target/flower-venv/bin/{python,flwr,flower-*})
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/flower-venv
stamp="$venv/.fedfuse-requirements"
pins=(
    flwr==1.41.0
    # protoc for scripts/gen-flower-proto.sh and python/tests/test_flower_proto.py: the last
    # release for protobuf 6 (1.82 needs protobuf 7; flwr 1.41.0 needs protobuf<7).
    grpcio-tools==1.81.1
    numpy==2.4.6
    maturin==1.16.0
    pytest==9.2.0
    # CI spreads the Flower tests over two workers (most of their time is Flower's polls).
    pytest-xdist==3.8.0
    execnet==2.1.2
    safetensors==0.8.0
    # flwr[dp]'s accountant backend: the published RDP accountant fedfuse's is checked against.
    dp-accounting==0.6.0
    # fedfuse.run's `rounds.to_pandas()` (optional for users; its test needs it).
    pandas==3.1.1
    # TensorBoard's own event reader checks the event files fedfuse writes (--tensorboard).
    tensorboard==2.21.0
)

py_version=$(python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
want=$(printf '%s\n' "python==$py_version" "${pins[@]}")

# A venv whose interpreter no longer runs (the base Python moved or changed) is rebuilt.
if [ -e "$venv" ] && ! "$venv/bin/python" -c '' >/dev/null 2>&1; then
    rm -rf "$venv"
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
rm -f "$stamp"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet "${pins[@]}"
printf '%s\n' "$want" >"$stamp"
