"""torchvision Vision Transformers trained apart in PyTorch, fused by `fedfuse fuse --model
examples/fuse/mnist-vit.toml` (issue 46; never in CI: it needs torch and torchvision).

Per seed:
1. Two `torchvision.models.VisionTransformer`s of examples/mnist-vit.toml's shape (28x28
   images, patches of 7, 2 blocks of 4 heads, hidden 32, MLP 64, no dropout), their
   `conv_proj` given 1 input channel (MNIST), start from different initialisations and train
   with Adam on two label-skewed halves of an MNIST training slice (of each digit 0-4 client 0
   takes 80% and client 1 20%, of each digit 5-9 the other way round).
2. Their state_dicts are saved with `safetensors.torch.save_file`, under torchvision's names.
3. `fedfuse fuse` fuses them by coordinate-wise averaging, by weight matching (the residual
   stream, each block's heads and MLP units), by PFNM and by GPI-FNM (the stream and heads at
   their widths, each block's MLP units growing). PFNM's sigma and GPI-FNM's sigma and eps are
   chosen per seed on VAL training images outside the slice (PyTorch's accuracy on them),
   never on the test images.
4. Every fused file is loaded into torchvision's module with `load_state_dict(strict=True)`:
   the same module where the widths are the clients', and otherwise the same module tree with
   each block's `mlp` a torchvision `MLPBlock` of its fused width. It is scored in eval mode
   on the first TEST MNIST test images, and fedfuse scores the same weights on the same images
   (its server evaluation); the two must agree (to one image, for a test image whose two top
   logits lie within float rounding).

Pixels are x / 255, as fedfuse loads MNIST. Writes the facts (settings, per-seed accuracies,
chosen settings, fused widths, commands) to experiments/matching/torch-vit-mnist.json.

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
from torchvision.models.vision_transformer import MLPBlock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_torch_cnns import (  # noqa: E402
    FedfuseScorer, fit, import_fedfuse, label_skew, mnist, model_toml, parse_args,
    torch_accuracy,
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
VAL = 2000  # training images outside the slice, for choosing PFNM's and GPI-FNM's settings
SIGMAS = [0.01, 0.03, 0.1, 0.3, 1.0]
EPSES = [0.1, 1.0]
# Each fusion's candidate flags; with more than one, the best on the validation images is kept
# (the first of equals).
FUSIONS = [
    ("fedavg", [["--method", "fedavg"]]),
    ("weight-matching", [["--method", "weight-matching"]]),
    ("pfnm", [["--method", "pfnm", "--sigma", str(s)] for s in SIGMAS]),
    ("gpi-fnm", [["--method", "gpi-fnm", "--sigma", str(s), "--eps", str(e)]
                 for s in SIGMAS for e in EPSES]),
]


def vit(mlps=None):
    """The clients' module; with `mlps`, each block's MLP at its own width (a fused model's)."""
    model = torchvision.models.VisionTransformer(
        image_size=28, patch_size=SHAPE["patch"], num_layers=SHAPE["layers"],
        num_heads=SHAPE["heads"], hidden_dim=SHAPE["hidden"], mlp_dim=SHAPE["mlp"],
        num_classes=10)
    model.conv_proj = nn.Conv2d(1, SHAPE["hidden"], SHAPE["patch"], SHAPE["patch"])
    for i, width in enumerate(mlps or []):
        block = getattr(model.encoder.layers, f"encoder_layer_{i}")
        block.mlp = MLPBlock(SHAPE["hidden"], width, 0.0)
    return model


def mlp_widths(state_dict):
    return [state_dict[f"encoder.layers.encoder_layer_{i}.mlp.0.weight"].shape[0]
            for i in range(SHAPE["layers"])]


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


class WiderVitScorer(FedfuseScorer):
    """The same evaluation of a ViT whose blocks' MLPs have the widths `mlps` (a PFNM fusion):
    a `[model.vit]` table has one MLP width, so the model is written as its layer list, whose
    tensors are named by position (`0.conv_proj.weight`, `1.ln_1.weight`, ...)."""

    def __init__(self, mlps, data_dir, tmp):
        h = SHAPE["hidden"]
        layers = [{"type": "tokens", "hidden": h, "patch": SHAPE["patch"]}]
        layers += [{"type": "encoder", "heads": SHAPE["heads"], "mlp": m} for m in mlps]
        layers += [{"type": "class_token"}, {"type": "layernorm", "eps": 1e-6},
                   {"type": "linear", "out": 10}]
        super().__init__(layers, data_dir, tmp)
        self.mlps = mlps

    def accuracy(self, state_dict):
        blocks = len(self.mlps)

        def listed(name):
            for prefix, at in [("conv_proj.", "0.conv_proj."), ("class_token", "0.class_token"),
                               ("encoder.pos_embedding", "0.pos_embedding"),
                               ("encoder.ln.", f"{blocks + 2}."),
                               ("heads.head.", f"{blocks + 3}.")]:
                if name.startswith(prefix):
                    return at + name[len(prefix):]
            _, _, index, rest = name.split(".", 3)  # encoder.layers.encoder_layer_{i}.rest
            return f"{int(index.rsplit('_', 1)[1]) + 1}.{rest}"

        return super().accuracy({listed(k): v for k, v in state_dict.items()})


def main():
    args = parse_args(OUT)
    # One thread and deterministic kernels: a rerun trains the same clients (two threads gave
    # other clients, and so other fusions, from run to run).
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
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
        "data": {"train_slice": TRAIN_SLICE, "validation": VAL, "test": TEST,
                 "split": "label skew, 80% of digits 0-4 to client 0 and of 5-9 to client 1",
                 "validation_images": "the VAL training images after the slice in the seed's "
                                      "permutation (never the test images)",
                 "pixels": "x / 255"},
        "train": {"optimizer": "adam", "lr": LR, "epochs": EPOCHS, "batch_size": BATCH},
        "commands": {name: ["fedfuse fuse client0.safetensors client1.safetensors --model "
                            "examples/fuse/mnist-vit.toml --seed 0 --out FUSED.safetensors "
                            + " ".join(flags) for flags in candidates]
                     for name, candidates in FUSIONS},
        "seeds": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        scorers = {}

        def scorer(mlps):
            key = tuple(mlps)
            if key not in scorers:
                scorers[key] = (VitScorer(args.data_dir, tmp) if mlps == [SHAPE["mlp"]] * len(mlps)
                                else WiderVitScorer(mlps, args.data_dir, tmp))
            return scorers[key]

        def fuse(flags):
            fused = os.path.join(tmp, "fused.safetensors")
            subprocess.run([args.fedfuse, "fuse", "client0.safetensors", "client1.safetensors",
                            "--model", MODEL_FILE, "--seed", "0", "--out", fused, *flags],
                           check=True, capture_output=True, cwd=tmp)
            state = load_file(fused)
            model = vit(mlp_widths(state))
            model.load_state_dict(state, strict=True)
            return model

        for seed in SEEDS:
            rng = np.random.default_rng(seed)
            order = rng.permutation(len(y_all))
            pick, held = order[:TRAIN_SLICE], order[TRAIN_SLICE:TRAIN_SLICE + VAL]
            x, y = x_all[pick], y_all[pick]
            x_val, y_val = x_all[held], y_all[held]
            row = {"seed": seed, "clients": [], "fused": {}, "fedfuse_scored": {},
                   "chosen": {}, "validation": {}, "mlp_widths": {}}
            for j, part in enumerate(label_skew(y, rng)):
                started = time.time()
                model = train(1000 * seed + j, x[part], y[part])
                save_file(model.state_dict(), os.path.join(tmp, f"client{j}.safetensors"))
                acc, _ = torch_accuracy(model, x_test, y_test)
                print(f"seed {seed} client {j}: {len(part)} images, "
                      f"{time.time() - started:.0f} s, accuracy {acc:.4f}", flush=True)
                row["clients"].append(acc)
            for name, candidates in FUSIONS:
                best = None
                for flags in candidates:
                    model = fuse(flags)
                    if len(candidates) > 1:
                        val, _ = torch_accuracy(model, x_val, y_val)
                        row["validation"].setdefault(name, []).append(
                            {"flags": " ".join(flags), "accuracy": val})
                        if best is not None and val <= best[0]:
                            continue
                        best = (val, flags, model)
                    else:
                        best = (None, flags, model)
                _, flags, model = best
                row["chosen"][name] = " ".join(flags)
                acc, margin = torch_accuracy(model, x_test, y_test)
                mlps = mlp_widths(model.state_dict())
                ours = scorer(mlps).accuracy(model.state_dict())
                print(f"seed {seed} {name} ({' '.join(flags)}; MLP widths {mlps}): accuracy "
                      f"{acc:.4f} (fedfuse {ours:.4f}; smallest top-2 logit gap {margin:.2e})",
                      flush=True)
                # An image whose two top logits lie within float rounding may flip: one at most.
                assert abs(acc - ours) <= 1.0 / TEST + 1e-9, (name, acc, ours)
                row["fused"][name] = acc
                row["fedfuse_scored"][name] = ours
                row["mlp_widths"][name] = mlps
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
