"""torchvision Vision Transformers trained apart in PyTorch, fused by `fedfuse fuse --model
examples/fuse/mnist-vit.toml` (issue 46; never in CI: it needs torch and torchvision).

Per seed:
1. Two `torchvision.models.VisionTransformer`s of examples/mnist-vit.toml's shape (28x28
   images, patches of 7, 2 blocks of 4 heads, hidden 32, MLP 64, no dropout), their
   `conv_proj` given 1 input channel (MNIST), start from different initialisations and train
   with Adam on two label-skewed halves of an MNIST training slice (of each digit 0-4 client 0
   takes 80% and client 1 20%, of each digit 5-9 the other way round).
2. Their state_dicts are saved with `safetensors.torch.save_file`, under torchvision's names.
3. `fedfuse fuse` fuses them by coordinate-wise averaging and by weight matching (the
   residual stream, each block's heads and MLP units).
4. Every fused file is loaded into the same torchvision module with `load_state_dict(strict=
   True)` and scored in eval mode on the first TEST MNIST test images, and fedfuse scores the
   same weights on the same images (its server evaluation); the two must agree (to one image,
   for a test image whose two top logits lie within float rounding).

Pixels are x / 255, as fedfuse loads MNIST. Writes the facts (settings, per-seed accuracies,
commands) to experiments/matching/torch-vit-mnist.json.

    bash scripts/torch-venv.sh && bash scripts/python-dev.sh &&
    cargo build --release -p fedfuse &&
    target/torch-venv/bin/python scripts/fuse_torch_vits.py --data-dir ../shared/data/mnist
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
    FedfuseScorer, fit, import_fedfuse, label_skew, mnist, parse_args, torch_accuracy,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "experiments", "matching", "torch-vit-mnist.json")
MODEL_FILE = os.path.join(ROOT, "examples", "fuse", "mnist-vit.toml")
COMMAND = ("target/torch-venv/bin/python scripts/fuse_torch_vits.py "
           "--data-dir ../shared/data/mnist")

SEEDS = [0, 1, 2]  # each: the training slice and split, two initialisations, batch orders
TRAIN_SLICE = 8000
TEST = 2000
EPOCHS = 5
BATCH = 32
LR = 0.002  # Adam, examples/mnist-vit.toml's rate
SHAPE = {"patch": 7, "hidden": 32, "layers": 2, "heads": 4, "mlp": 64}
FUSIONS = [
    ("fedavg", ["--method", "fedavg"]),
    ("weight-matching", ["--method", "weight-matching"]),
]


def vit():
    model = torchvision.models.VisionTransformer(
        image_size=28, patch_size=SHAPE["patch"], num_layers=SHAPE["layers"],
        num_heads=SHAPE["heads"], hidden_dim=SHAPE["hidden"], mlp_dim=SHAPE["mlp"],
        num_classes=10)
    model.conv_proj = nn.Conv2d(1, SHAPE["hidden"], SHAPE["patch"], SHAPE["patch"])
    return model


def train(seed, x, y):
    torch.manual_seed(seed)
    model = vit()
    return fit(model, torch.optim.Adam(model.parameters(), lr=LR), seed, x, y, EPOCHS, BATCH)


class VitScorer(FedfuseScorer):
    """fedfuse's server evaluation of examples/fuse/mnist-vit.toml's ViT on the first TEST
    MNIST test images; the arrays keep torchvision's names, as a ViT's do over Flower."""

    def __init__(self, data_dir, tmp):
        # Its own config: the parent's writes a layer list, a ViT is a [model.vit] table.
        import fedfuse._core as core

        config = os.path.join(tmp, "score.toml")
        vit_table = "".join(f"{k} = {v}\n" for k, v in SHAPE.items())
        with open(config, "w") as f:
            f.write("seed = 0\nrounds = 1\nclients = 1\n"
                    f"data_dir = {json.dumps(os.path.abspath(data_dir))}\n\n"
                    f'[dataset]\nname = "mnist"\ntrain_samples = 100\ntest_samples = {TEST}\n\n'
                    '[method]\nname = "fedavg"\n\n[model]\nkind = "vit"\n\n'
                    f"[model.vit]\n{vit_table}")
        self.server = core.Server(config, [])


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
        "model": "torchvision.models.VisionTransformer(image_size=28, patch_size=7, "
                 "num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=10), "
                 "conv_proj with 1 input channel",
        "data": {"train_slice": TRAIN_SLICE, "test": TEST,
                 "split": "label skew, 80% of digits 0-4 to client 0 and of 5-9 to client 1",
                 "pixels": "x / 255"},
        "train": {"optimizer": "adam", "lr": LR, "epochs": EPOCHS, "batch_size": BATCH},
        "commands": {name: "fedfuse fuse client0.safetensors client1.safetensors --model "
                           "examples/fuse/mnist-vit.toml --seed 0 --out FUSED.safetensors "
                           + " ".join(flags)
                     for name, flags in FUSIONS},
        "seeds": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        scorer = VitScorer(args.data_dir, tmp)
        for seed in SEEDS:
            rng = np.random.default_rng(seed)
            pick = rng.permutation(len(y_all))[:TRAIN_SLICE]
            x, y = x_all[pick], y_all[pick]
            row = {"seed": seed, "clients": [], "fused": {}, "fedfuse_scored": {}}
            for j, part in enumerate(label_skew(y, rng)):
                started = time.time()
                model = train(1000 * seed + j, x[part], y[part])
                save_file(model.state_dict(), os.path.join(tmp, f"client{j}.safetensors"))
                acc, _ = torch_accuracy(model, x_test, y_test)
                print(f"seed {seed} client {j}: {len(part)} images, "
                      f"{time.time() - started:.0f} s, accuracy {acc:.4f}", flush=True)
                row["clients"].append(acc)
            for name, flags in FUSIONS:
                fused = os.path.join(tmp, "fused.safetensors")
                subprocess.run([args.fedfuse, "fuse", "client0.safetensors",
                                "client1.safetensors", "--model", MODEL_FILE, "--seed", "0",
                                "--out", fused, *flags], check=True, capture_output=True,
                               cwd=tmp)
                model = vit()
                model.load_state_dict(load_file(fused), strict=True)
                acc, margin = torch_accuracy(model, x_test, y_test)
                ours = scorer.accuracy(model.state_dict())
                print(f"seed {seed} {name}: accuracy {acc:.4f} (fedfuse {ours:.4f}; smallest "
                      f"top-2 logit gap {margin:.2e})", flush=True)
                # An image whose two top logits lie within float rounding may flip: one at most.
                assert abs(acc - ours) <= 1.0 / TEST + 1e-9, (name, acc, ours)
                row["fused"][name] = acc
                row["fedfuse_scored"][name] = ours
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
