"""Two PyTorch CNNs with batch norm, trained apart and fused by fedfuse (issue 33; never in CI).

1. Two copies of one small `nn.Sequential` CNN (conv-BN-ReLU-pool twice, then two linear
   layers) start from different seeds and train on two label-skewed halves of an MNIST
   training slice: of each digit 0-4 client 0 takes 80% and client 1 20%, of each digit 5-9
   the other way round.
2. Their state_dicts (BatchNorm running statistics and I64 `num_batches_tracked` included) are
   saved as safetensors, with the layer list as a `[model]` TOML file and the facts behind
   them (seeds, settings, class counts, each client's accuracy) as JSON, in
   python/tests/fixtures/torch_cnns/: python/tests/test_fuse.py fuses them without torch.
3. `fedfuse fuse` fuses them with PFNM (at its defaults, and with sigma 0.1), weight matching
   and coordinate-wise FedAvg (the unmatched baseline). Each fused file is loaded into an
   `nn.Sequential` built from the file's own `fedfuse.model` metadata with
   `load_state_dict(strict=True)` and scored in eval mode on the first TEST MNIST test images;
   fedfuse scores the same weights on the same images (the server evaluation of `fedfuse run`
   and `fedfuse.flwr.evaluate_fn`), and the two accuracies must agree. Widths, accuracies and
   each model's smallest gap between its two top logits go in the JSON.

Pixels are scaled to [0, 1] by dividing by 255, as fedfuse loads MNIST; no other normalisation.

    bash scripts/torch-venv.sh && bash scripts/python-dev.sh &&
    cargo build --release -p fedfuse &&
    target/torch-venv/bin/python scripts/fuse_torch_cnns.py --data-dir ../shared/data/mnist
"""

import argparse
import gzip
import io
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tomllib

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "python", "tests", "fixtures", "torch_cnns")
COMMAND = ("target/torch-venv/bin/python scripts/fuse_torch_cnns.py "
           "--data-dir ../shared/data/mnist")

INPUT = [1, 28, 28]
LAYERS = [
    {"type": "conv2d", "out": 8, "kernel": 5, "padding": 2},
    {"type": "batchnorm2d"},
    {"type": "relu"},
    {"type": "maxpool2d", "kernel": 2},
    {"type": "conv2d", "out": 16, "kernel": 5, "padding": 2},
    {"type": "batchnorm2d"},
    {"type": "relu"},
    {"type": "maxpool2d", "kernel": 2},
    {"type": "flatten"},
    {"type": "linear", "out": 32},
    {"type": "relu"},
    {"type": "linear", "out": 10},
]

TRAIN_SLICE = 8000  # training images drawn (with SPLIT_SEED) from MNIST's 60,000
TEST = 2000  # the first TEST images of MNIST's test set
SPLIT_SEED = 0
INIT_SEEDS = [1, 2]  # one per client: separate initialisations and batch orders
MAJOR = 0.8  # client 0's share of each digit 0-4 and client 1's of each digit 5-9
EPOCHS = 3
BATCH = 32
LR = 1e-3  # Adam
# (name, method, settings): PFNM at fedfuse's defaults (sigma = sigma0 = gamma = 1); PFNM with
# sigma = 0.1, a unit variance nearer the scale of the clients' weights, so that unlike units
# stay apart, and sigma0 = 10, a prior that hardly shrinks the fused weights; Git Re-Basin's
# weight matching; coordinate-wise FedAvg, the unmatched baseline.
FUSIONS = [
    ("pfnm", "pfnm", {}),
    ("pfnm-sigma0.1", "pfnm", {"sigma": 0.1, "sigma0": 10.0}),
    ("weight-matching", "weight-matching", {}),
    ("fedavg", "fedavg", {}),
]
FUSE_SEED = 0


def idx(folder, name, offset):
    with gzip.open(os.path.join(folder, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def mnist(folder, split):
    prefix = "train" if split == "train" else "t10k"
    x = idx(folder, f"{prefix}-images-idx3-ubyte.gz", 16).reshape(-1, *INPUT)
    y = idx(folder, f"{prefix}-labels-idx1-ubyte.gz", 8)
    return x.astype(np.float32) / 255.0, y.astype(np.int64)


def label_skew(y, rng):
    """Indices of the two clients: each digit's examples shuffled, the first MAJOR of digits
    0-4 (the first 1 - MAJOR of digits 5-9) to client 0, the rest to client 1."""
    parts = [[], []]
    for digit in range(10):
        members = rng.permutation(np.flatnonzero(y == digit))
        share = MAJOR if digit < 5 else 1.0 - MAJOR
        cut = int(round(share * len(members)))
        parts[0].extend(members[:cut])
        parts[1].extend(members[cut:])
    return [np.sort(np.asarray(p)) for p in parts]


def from_layers(layers, input_shape):
    """The `nn.Sequential` a fedfuse layer list of these kinds means."""
    shape = list(input_shape)
    modules = []
    for layer in layers:
        kind = layer["type"]
        if kind == "conv2d":
            k, pad, stride = layer["kernel"], layer.get("padding", 0), layer.get("stride", 1)
            modules.append(nn.Conv2d(shape[0], layer["out"], k, stride, pad,
                                     bias=layer.get("bias", True)))
            side = [(s + 2 * pad - k) // stride + 1 for s in shape[1:]]
            shape = [layer["out"], *side]
        elif kind == "batchnorm2d":
            modules.append(nn.BatchNorm2d(shape[0], eps=layer.get("eps", 1e-5),
                                          momentum=layer.get("momentum", 0.1)))
        elif kind == "relu":
            modules.append(nn.ReLU())
        elif kind == "maxpool2d":
            k = layer["kernel"]
            stride = layer.get("stride", k)
            modules.append(nn.MaxPool2d(k, stride))
            shape = [shape[0], *[(s - k) // stride + 1 for s in shape[1:]]]
        elif kind == "flatten":
            modules.append(nn.Flatten())
            shape = [math.prod(shape)]
        elif kind == "linear":
            modules.append(nn.Linear(shape[0], layer["out"], bias=layer.get("bias", True)))
            shape = [layer["out"]]
        else:
            raise ValueError(f"layer type {kind!r} is not built here")
    return nn.Sequential(*modules)


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def model_toml(layers, input_shape=None):
    lines = ["[model]", 'kind = "sequential"']
    if input_shape is not None:
        lines.append(f"input = {toml_value(input_shape)}")
    lines.append("layers = [")
    lines += [f"    {toml_value(layer)}," for layer in layers]
    lines.append("]")
    return "\n".join(lines) + "\n"


def fit(model, opt, seed, x, y, epochs, batch_size):
    """`epochs` of cross-entropy steps on batches of `batch_size`, in an order drawn from
    `seed`; the model in eval mode."""
    order = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(yt), generator=order)
        for start in range(0, len(perm), batch_size):
            batch = perm[start:start + batch_size]
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[batch]), yt[batch]).backward()
            opt.step()
    return model.eval()


def train(seed, x, y):
    torch.manual_seed(seed)
    model = from_layers(LAYERS, INPUT)
    return fit(model, torch.optim.Adam(model.parameters(), lr=LR), seed, x, y, EPOCHS, BATCH)


def torch_accuracy(model, x, y):
    """Accuracy in eval mode, and the smallest gap between an image's two largest logits (an
    argmax can only change under rounding differences larger than that)."""
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
    top = logits.topk(2, dim=1).values
    margin = float((top[:, 0] - top[:, 1]).min())
    return float(np.mean(logits.argmax(1).numpy() == y)), margin


def npy(array):
    buf = io.BytesIO()
    np.save(buf, np.asarray(array, dtype="<f4"), allow_pickle=False)  # keeps 0-d
    return buf.getvalue()


class FedfuseScorer:
    """fedfuse's server evaluation (what `fedfuse.flwr.evaluate_fn` wraps; this venv has no
    flwr) on the first TEST MNIST test images, for one layer list."""

    made = itertools.count()

    def __init__(self, layers, data_dir, tmp):
        import fedfuse._core as core

        config = os.path.join(tmp, f"score{next(self.made)}.toml")
        with open(config, "w") as f:
            f.write(score_config(layers, data_dir))
        self.server = core.Server(config, [])

    def accuracy(self, state_dict):
        arrays = [(k, "float32", list(v.shape), "numpy.ndarray", npy(v.float().numpy()))
                  for k, v in state_dict.items()]
        _, acc = self.server.evaluate((arrays, [], []))
        return acc


def score_config(layers, data_dir):
    """A run config whose server scores `layers` on the first TEST MNIST test images."""
    return (
        "seed = 0\nrounds = 1\nclients = 1\n"
        f"data_dir = {json.dumps(os.path.abspath(data_dir))}\n\n"
        f'[dataset]\nname = "mnist"\ntrain_samples = 100\ntest_samples = {TEST}\n\n'
        '[method]\nname = "fedavg"\n\n' + model_toml(layers)
    )


def import_fedfuse():
    try:
        import fedfuse  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "target", "python-dev"))
        import fedfuse  # noqa: F401


def parse_args(out):
    """`--data-dir` (MNIST), `--fedfuse` (the binary, made absolute) and `--out`."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--fedfuse", default=os.path.join(ROOT, "target", "release", "fedfuse"))
    ap.add_argument("--out", default=out)
    args = ap.parse_args()
    args.fedfuse = os.path.abspath(args.fedfuse)
    return args


def main():
    args = parse_args(OUT)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    import_fedfuse()

    x_all, y_all = mnist(args.data_dir, "train")
    x_test, y_test = mnist(args.data_dir, "test")
    x_test, y_test = x_test[:TEST], y_test[:TEST]
    rng = np.random.default_rng(SPLIT_SEED)
    pick = np.sort(rng.choice(len(y_all), TRAIN_SLICE, replace=False))
    x_all, y_all = x_all[pick], y_all[pick]
    parts = label_skew(y_all, rng)
    counts = [np.bincount(y_all[p], minlength=10).tolist() for p in parts]

    os.makedirs(args.out, exist_ok=True)
    toml_path = os.path.join(args.out, "cnn.toml")
    with open(toml_path, "w") as f:
        f.write(f"# Written by {COMMAND}\n" + model_toml(LAYERS, INPUT))
    counts_path = os.path.join(args.out, "class_counts.json")
    with open(counts_path, "w") as f:
        json.dump(counts, f)
        f.write("\n")

    facts = {
        "generated_by": COMMAND,
        "torch": torch.__version__,
        "data": {
            "train_slice": TRAIN_SLICE, "split_seed": SPLIT_SEED,
            "split": (f"label skew: of each digit 0-4 client 0 takes {MAJOR:.0%} and client 1 "
                      f"the rest, of each digit 5-9 the other way round"),
            "pixels": "x / 255",
            "test": f"the first {TEST} MNIST test images",
        },
        "train": {"optimizer": "adam", "lr": LR, "epochs": EPOCHS, "batch_size": BATCH,
                  "init_seeds": INIT_SEEDS},
        "class_counts": counts,
        "clients": [],
        "fused": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        scorer = FedfuseScorer(LAYERS, args.data_dir, tmp)
        for j, (seed, part) in enumerate(zip(INIT_SEEDS, parts)):
            started = time.time()
            model = train(seed, x_all[part], y_all[part])
            seconds = time.time() - started
            path = os.path.join(args.out, f"client{j}.safetensors")
            save_file(model.state_dict(), path)
            os.chmod(path, 0o644)
            acc, margin = torch_accuracy(model, x_test, y_test)
            ours = scorer.accuracy(model.state_dict())
            print(f"client {j}: seed {seed}, {len(part)} images, {seconds:.1f} s, "
                  f"accuracy {acc:.4f} (fedfuse {ours:.4f})")
            assert abs(acc - ours) < 1e-6, (acc, ours)
            facts["clients"].append({"file": os.path.basename(path), "init_seed": seed,
                                     "examples": len(part), "accuracy": acc,
                                     "min_logit_margin": margin})

        for name, method, settings in FUSIONS:
            fused_path = os.path.join(tmp, f"{name}.safetensors")
            flags = [a for k, v in settings.items() for a in (f"--{k}", str(v))]
            flags += ["--method", method, "--class-counts", "class_counts.json",
                      "--seed", str(FUSE_SEED)]
            subprocess.run([args.fedfuse, "fuse", "client0.safetensors", "client1.safetensors",
                            "--out", fused_path, "--model", "cnn.toml", *flags],
                           check=True, capture_output=True, cwd=args.out)
            with safe_open(fused_path, "pt") as f:
                meta = f.metadata()
            stored = tomllib.loads(meta["fedfuse.model"])
            stored = stored.get("model", stored)
            widths = json.loads(meta["fedfuse.widths"])
            state = load_file(fused_path)
            assert all(v.dtype == torch.int64 for k, v in state.items()
                       if k.endswith("num_batches_tracked"))
            model = from_layers(stored["layers"], stored["input"])
            model.load_state_dict(state, strict=True)
            acc, margin = torch_accuracy(model, x_test, y_test)
            ours = FedfuseScorer(stored["layers"], args.data_dir, tmp).accuracy(
                model.state_dict())
            print(f"{name}: widths {widths}, accuracy {acc:.4f} (fedfuse {ours:.4f}), "
                  f"smallest logit margin {margin:.2e}")
            assert abs(acc - ours) < 1e-6, (name, acc, ours)
            facts["fused"].append({
                "name": name, "method": method, "settings": dict(settings, seed=FUSE_SEED),
                "widths": widths, "accuracy": acc, "min_logit_margin": margin,
                "command": " ".join(["fedfuse fuse client0.safetensors client1.safetensors "
                                     "--out FUSED.safetensors --model cnn.toml", *flags]),
            })
    with open(os.path.join(args.out, "facts.json"), "w") as f:
        json.dump(facts, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
