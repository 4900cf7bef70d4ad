"""torchvision ResNet-18s trained apart in PyTorch, fused by `fedfuse fuse --model resnet18`
(issue 45; never in CI: it needs torch and torchvision).

Per seed:
1. Two `torchvision.models.resnet18(num_classes=10)`, their `conv1` swapped for a 1-channel
   one (MNIST), start from different initialisations and train on two label-skewed halves of
   an MNIST training slice (of each digit 0-4 client 0 takes 80% and client 1 20%, of each
   digit 5-9 the other way round).
2. Their state_dicts are saved with `safetensors.torch.save_file`, under torchvision's names.
3. `fedfuse fuse --model resnet18` fuses them by coordinate-wise averaging and by weight
   matching, each with the averaged batch-norm statistics and with them re-estimated
   (`--reset-bn`) on RESET held-out training images (neither client's).
4. Every fused file is loaded into the same torchvision module with `load_state_dict(strict=
   True)` and scored in eval mode on the first TEST MNIST test images, and fedfuse scores the
   same weights on the same images (its server evaluation); the two must agree (to one image,
   for a test image whose two top logits lie within float rounding).

Pixels are x / 255, as fedfuse loads MNIST. Writes the facts (settings, per-seed accuracies,
commands) to experiments/matching/torch-resnet18-mnist.json; the weights are not kept (45 MB
a model).

    bash scripts/torch-venv.sh && bash scripts/python-dev.sh &&
    cargo build --release -p fedfuse &&
    target/torch-venv/bin/python scripts/fuse_torch_resnets.py --data-dir ../shared/data/mnist
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torchvision
from safetensors.torch import load_file, save_file
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_torch_cnns import (  # noqa: E402
    fit, import_fedfuse, label_skew, mnist, npy, parse_args,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "experiments", "matching", "torch-resnet18-mnist.json")
COMMAND = ("target/torch-venv/bin/python scripts/fuse_torch_resnets.py "
           "--data-dir ../shared/data/mnist")

SEEDS = [0, 1, 2]  # each: the training slice and split, two initialisations, batch orders
TRAIN_SLICE = 8000
RESET = 500  # held-out training images for --reset-bn
TEST = 2000
MAJOR = 0.8
EPOCHS = 2
BATCH = 64
LR = 0.05  # SGD, momentum 0.9
BLOCKS = [2, 2, 2, 2]
FUSIONS = [
    ("fedavg", ["--method", "fedavg"]),
    ("fedavg + reset", ["--method", "fedavg", "--reset-bn", "reset.npz"]),
    ("weight-matching", ["--method", "weight-matching"]),
    ("weight-matching + reset", ["--method", "weight-matching", "--reset-bn", "reset.npz"]),
]


def resnet18():
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return model


def train(seed, x, y):
    torch.manual_seed(seed)
    model = resnet18()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    return fit(model, opt, seed, x, y, EPOCHS, BATCH)


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(x[i:i + 500])) for i in range(0, len(x), 500)])
    return float(np.mean(logits.argmax(1).numpy() == y))


def list_name(name):
    """fedfuse's layer-list name of a torchvision ResNet-18 tensor: conv1 is layer 0, bn1 1,
    the blocks 4 to 11, fc 14 (what fedfuse's `TorchvisionNames` inverts)."""
    head, rest = name.split(".", 1)
    if head == "conv1":
        return f"0.{rest}"
    if head == "bn1":
        return f"1.{rest}"
    if head == "fc":
        return f"{4 + sum(BLOCKS) + 2}.{rest}"
    stage = int(head.removeprefix("layer"))
    block, rest = rest.split(".", 1)
    index = 4 + sum(BLOCKS[:stage - 1]) + int(block)
    return f"{index}.{rest.replace('downsample.', 'shortcut.')}"


class FedfuseScorer:
    """fedfuse's server evaluation of a ResNet-18 (width 64) on the first TEST test images."""

    def __init__(self, data_dir, tmp):
        import fedfuse._core as core

        config = os.path.join(tmp, "score.toml")
        with open(config, "w") as f:
            f.write("seed = 0\nrounds = 1\nclients = 1\n"
                    f"data_dir = {json.dumps(os.path.abspath(data_dir))}\n\n"
                    f'[dataset]\nname = "mnist"\ntrain_samples = 100\ntest_samples = {TEST}\n\n'
                    '[method]\nname = "fedavg"\n\n[model]\nkind = "resnet18"\n')
        self.server = core.Server(config, [])

    def accuracy(self, state_dict):
        arrays = [(list_name(k), "float32", list(v.shape), "numpy.ndarray",
                   npy(v.float().numpy())) for k, v in state_dict.items()]
        _, acc = self.server.evaluate((arrays, [], []))
        return acc


def main():
    args = parse_args(OUT)
    torch.set_num_threads(2)
    import_fedfuse()

    x_all, y_all = mnist(args.data_dir, "train")
    x_test, y_test = mnist(args.data_dir, "test")
    x_test, y_test = x_test[:TEST], y_test[:TEST]
    facts = {
        "generated_by": COMMAND,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "model": "torchvision.models.resnet18(num_classes=10), conv1 with 1 input channel",
        "data": {"train_slice": TRAIN_SLICE, "reset_images": RESET, "test": TEST,
                 "split": f"label skew, {MAJOR:.0%} of digits 0-4 to client 0 and of 5-9 to "
                          "client 1", "pixels": "x / 255"},
        "train": {"optimizer": "sgd", "momentum": 0.9, "lr": LR, "epochs": EPOCHS,
                  "batch_size": BATCH},
        "commands": {name: "fedfuse fuse client0.safetensors client1.safetensors --model "
                           "resnet18 --seed 0 --out FUSED.safetensors " + " ".join(flags)
                     for name, flags in FUSIONS},
        "seeds": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        scorer = FedfuseScorer(args.data_dir, tmp)
        for seed in SEEDS:
            rng = np.random.default_rng(seed)
            pick = rng.permutation(len(y_all))
            train_idx, reset_idx = pick[:TRAIN_SLICE], pick[TRAIN_SLICE:TRAIN_SLICE + RESET]
            x, y = x_all[train_idx], y_all[train_idx]
            np.savez(os.path.join(tmp, "reset.npz"), x=x_all[reset_idx])
            row = {"seed": seed, "clients": [], "fused": {}}
            for j, part in enumerate(label_skew(y, rng)):
                started = time.time()
                model = train(1000 * seed + j, x[part], y[part])
                save_file(model.state_dict(), os.path.join(tmp, f"client{j}.safetensors"))
                acc = accuracy(model, x_test, y_test)
                print(f"seed {seed} client {j}: {len(part)} images, "
                      f"{time.time() - started:.0f} s, accuracy {acc:.4f}", flush=True)
                row["clients"].append(acc)
            for name, flags in FUSIONS:
                fused = os.path.join(tmp, "fused.safetensors")
                subprocess.run([args.fedfuse, "fuse", "client0.safetensors",
                                "client1.safetensors", "--model", "resnet18", "--seed", "0",
                                "--out", fused, *flags], check=True, capture_output=True,
                               cwd=tmp)
                model = resnet18()
                model.load_state_dict(load_file(fused), strict=True)
                acc = accuracy(model, x_test, y_test)
                ours = scorer.accuracy(model.state_dict())
                print(f"seed {seed} {name}: accuracy {acc:.4f} (fedfuse {ours:.4f})", flush=True)
                # An image whose two top logits lie within float rounding may flip: one at most.
                assert abs(acc - ours) <= 1.0 / TEST + 1e-9, (name, acc, ours)
                row["fused"][name] = acc
                row.setdefault("fedfuse_scored", {})[name] = ours
            facts["seeds"].append(row)
    for name, _ in FUSIONS:
        accs = [r["fused"][name] for r in facts["seeds"]]
        print(f"{name}: mean {np.mean(accs):.4f}, sd {np.std(accs, ddof=1):.4f}, {accs}")
    with open(args.out, "w") as f:
        json.dump(facts, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
