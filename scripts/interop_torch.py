"""PyTorch round trip of a model with batch norm (never in CI; torch in target/torch-venv):

1. PyTorch saves a ResNet-20 (width 4, batch norm, 1 input channel) state_dict, with its I64
   `num_batches_tracked`, as safetensors;
2. `fedfuse run` starts from it (`model.init_from`) and trains 5 rounds of FedAvg on 3,000 MNIST samples;
3. PyTorch loads the run's model.safetensors with `load_state_dict(strict=True)` and scores it
   in eval mode on the same test samples: the accuracy must be the one fedfuse reports.

    bash scripts/torch-venv.sh && cargo build --release -p fedfuse &&
    target/torch-venv/bin/python scripts/interop_torch.py --data-dir ../shared/data/mnist
"""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from zoo_reference import resnet20  # noqa: E402

TEST = 500


def mnist_test(folder, n):
    with gzip.open(os.path.join(folder, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(folder, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.tensor(x[:n], dtype=torch.float32) / 255.0, torch.tensor(y[:n], dtype=torch.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--fedfuse", default="target/release/fedfuse")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = resnet20(10, "batch", width=4, channels=1)
    with tempfile.TemporaryDirectory() as tmp:
        start = os.path.join(tmp, "start.safetensors")
        save_file(model.state_dict(), start)
        out = os.path.join(tmp, "run")
        subprocess.run([
            args.fedfuse, "run", "examples/mnist-cnn-leaf.toml", "--out", out, "--quiet",
            "--data-dir", args.data_dir,
            "--set", 'model.kind="resnet20"', "--set", "model.width=4",
            "--set", f"model.init_from={json.dumps(start)}",
            "--set", "dataset.train_samples=3000", "--set", f"dataset.test_samples={TEST}",
            "--set", "rounds=5",
        ], check=True)
        trained = load_file(os.path.join(out, "model.safetensors"))
        with open(os.path.join(out, "results.json")) as f:
            reported = json.load(f)["rounds"][-1]["global_accuracy"]
    counters = {k: v for k, v in trained.items() if k.endswith("num_batches_tracked")}
    assert counters and all(v.dtype == torch.int64 for v in counters.values()), counters
    model.load_state_dict(trained, strict=True)
    model.eval()
    x, y = mnist_test(args.data_dir, TEST)
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"fedfuse reports {reported:.4f}; PyTorch measures {acc:.4f} on the same {TEST} samples")
    print(f"{len(trained)} tensors loaded with strict=True; num_batches_tracked "
          f"{sorted(set(int(v) for v in counters.values()))}")
    if abs(acc - reported) > 1.0 / TEST:
        sys.exit("the accuracies differ")


if __name__ == "__main__":
    main()
