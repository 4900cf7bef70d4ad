"""PyTorch's side of `fedfuse bench train`: the same networks, samples and loop (one epoch,
SGD lr 0.01, cross-entropy, a shuffled order, float32 tensors held in memory), timed the same
way (median of repeats). Never in CI; torch lives in target/torch-venv (scripts/torch-venv.sh).

    target/torch-venv/bin/python scripts/bench_torch_train.py --data-dir ../shared/data/mnist \
        --threads 1 --repeats 3 --models lenet5,cnn-leaf
"""

import argparse
import gzip
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from zoo_reference import cnn_leaf, resnet20, vgg9  # noqa: E402


def lenet5():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 100), nn.ReLU(), nn.Linear(100, 10))


def vit():
    from torchvision.models import VisionTransformer
    return VisionTransformer(32, 4, 6, 4, 128, 256, num_classes=10)


def mnist(folder, n):
    with gzip.open(os.path.join(folder, "train-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(folder, "train-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return (torch.tensor(x[:n], dtype=torch.float32) / 255.0,
            torch.tensor(y[:n], dtype=torch.int64))


def synthetic(n):
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 3, 32, 32, generator=g), torch.arange(n) % 10


# name: (label, module, data, batch) -- fedfuse's bench.rs has the same table.
def cases(data_dir):
    return {
        "mlp": ("MLP 784-100-10", mlp, lambda: mnist(data_dir, 60000), 64),
        "lenet5": ("LeNet-5 28x28x1", lenet5, lambda: mnist(data_dir, 5000), 32),
        "cnn-leaf": ("cnn-leaf 28x28x1", lambda: cnn_leaf(10), lambda: mnist(data_dir, 2000), 32),
        "vgg9": ("VGG-9 32x32x3", lambda: vgg9(10), lambda: synthetic(1000), 32),
        "resnet20": ("ResNet-20 32x32x3", lambda: resnet20(10, "batch"), lambda: synthetic(1000), 32),
        # fedfuse's default ViT: patch 4, 6 blocks of 4 heads, width 128, MLP 256.
        "vit": ("ViT (default) 32x32x3", vit, lambda: synthetic(500), 32),
    }


def epoch(model, x, y, batch, seed):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    model.train()
    for i in range(0, len(x), batch):
        idx = order[i:i + batch]
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="mlp,lenet5,cnn-leaf,vgg9,resnet20,vit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    table = cases(args.data_dir)
    print(f"PyTorch {torch.__version__}, {args.threads} thread(s), {args.repeats} repeats")
    for name in args.models.split(","):
        label, make, data, batch = table[name]
        x, y = data()
        secs, cpu = [], []
        for r in range(args.repeats):
            torch.manual_seed(0)
            model = make()
            t, c = time.perf_counter(), time.process_time()
            epoch(model, x, y, batch, r)
            secs.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        med = statistics.median(secs)
        # CPU time of the process, all threads: as `fedfuse bench train` reports it.
        print(f"{label}: {len(x)} samples, batch {batch}: median {med:.3f} s/epoch "
              f"(min {min(secs):.3f}, max {max(secs):.3f}) = {len(x) / med:.0f} samples/s; "
              f"CPU {statistics.median(cpu):.2f} s/epoch")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory {peak:.0f} MiB")


if __name__ == "__main__":
    main()
