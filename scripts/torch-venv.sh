#!/usr/bin/env bash
# PyTorch for reference values and benchmarks only (never CI): a venv under target/ with a
# pinned torch. The registry's wheel is the CUDA build (about 5 GB installed); it runs on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/torch-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    torch==2.15.0 numpy safetensors pillow
# torchvision for its ResNet modules only (pure Python); the registry's newest pairs with an
# older torch, so its own pin on torch is left out.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    torchvision==0.29.2
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
