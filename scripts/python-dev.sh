#!/usr/bin/env bash
# Makes the fedfuse Python package importable from the pinned venv (target/flower-venv) using the
# workspace's own debug build, so tests need no second (maturin) build of the Rust code:
# the module is target/debug/libfedfuse_py.so, staged with python/fedfuse under
# target/python-dev and put on the venv's path by a .pth file.
# Users install the package with `pip install ./python` (maturin) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/flower-venv.sh
# --all-targets resolves features as `cargo test --workspace` does, so nothing but our crates
# rebuilds after the tests.
cargo build --workspace --all-targets --locked --quiet
stage=target/python-dev
rm -rf "$stage"
mkdir -p "$stage/fedfuse"
cp python/fedfuse/*.py python/fedfuse/py.typed "$stage/fedfuse/"
cp target/debug/libfedfuse_py.so "$stage/fedfuse/_core.abi3.so"
site=$(target/flower-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$(pwd)/$stage" > "$site/fedfuse-dev.pth"
