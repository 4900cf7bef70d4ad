#!/usr/bin/env bash
# Regenerates crates/flower-proto/src/generated/flwr.proto.rs (prost) from the crate's .proto
# files, then checks those files against flwr's own descriptors. The generated file is
# committed: a normal build needs neither protoc nor prost-build. protoc here is grpcio-tools'
# (pinned in scripts/flower-venv.sh), behind a small wrapper that prost-build finds via PROTOC.
# Usage: scripts/gen-flower-proto.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/flower-venv.sh
python="$root/target/flower-venv/bin/python"
protoc="$root/target/flower-proto-protoc"
printf '#!/bin/sh\nexec "%s" -m grpc_tools.protoc "$@"\n' "$python" >"$protoc"
chmod +x "$protoc"
"$protoc" --version

PROTOC="$protoc" CARGO_INCREMENTAL=0 \
    cargo run --quiet -p fedfuse-flower-proto --features generate --example generate
# prost-build's output is already close to rustfmt's; this makes it exact.
rustfmt --edition 2024 crates/flower-proto/src/generated/flwr.proto.rs

"$python" -m pytest -q python/tests/test_flower_proto.py
