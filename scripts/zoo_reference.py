"""PyTorch reference values for fedfuse's layer lists and model zoo.

Writes crates/train/tests/fixtures/zoo_reference.json: for each case, the state_dict's names
and shapes, the parameter count, and the logits of fixed weights on fixed inputs in eval mode
(and, for networks without dropout, in train mode with the running statistics after that
batch). The weights and inputs come from `value(role, ...)` below, which the Rust test
computes the same way, so the fixture holds no weights.

The zoo networks are written out here as PyTorch code from their papers, independently of
fedfuse's lists, except ResNet-18, 34 and 50, which are torchvision's own `resnet18`/`34`/`50`
(their tensor names are the point); the `custom` cases are built from their layer lists by
`from_layers` (which is what a `kind = "sequential"` list means in PyTorch).

Run (torch in its own venv, never in CI): bash scripts/torch-venv.sh &&
    target/torch-venv/bin/python scripts/zoo_reference.py [CASE ...]
Named cases replace theirs in the fixture (or join it) and leave the others as they are: a
rerun on another CPU moves logits by float rounding, which is no reason to touch them.
"""

import sys

import json
import math
import os

import torch
from torch import nn

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "train", "tests", "fixtures",
                   "zoo_reference.json")
BATCH = 3


def wave(n, k):
    """Values in [-1, 1) from integer hashing (exact in any language): for j < n,
    2 ((2654435761 j + 97531 k + 12345) mod 2^32) / 2^32 - 1, in float64."""
    j = torch.arange(n, dtype=torch.int64)
    h = (j * 2654435761 + 97531 * k + 12345) % (1 << 32)
    return h.to(torch.float64) / float(1 << 32) * 2.0 - 1.0


def value(name, shape, k):
    """Tensor k (state_dict order) of a case, by its role."""
    n = math.prod(shape)
    s = wave(n, k)
    last = name.rsplit(".", 1)[-1]
    if last == "num_batches_tracked":
        return torch.tensor(7, dtype=torch.int64)
    if last == "running_mean":
        v = 0.1 * s
    elif last == "running_var":
        v = 1.0 + 0.5 * s
    elif len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        v = s * math.sqrt(3.0 / fan_in)
    elif last == "weight":
        v = 1.0 + 0.2 * s
    else:
        v = 0.1 * s
    return v.to(torch.float32).reshape(shape)


def inputs(shape):
    return wave(BATCH * math.prod(shape), 1000).to(torch.float32).reshape([BATCH, *shape])


class Residual(nn.Module):
    """He et al.'s basic block; `norm` is a function of the channel count, or None."""

    def __init__(self, c_in, out, stride, norm):
        super().__init__()
        bias = norm is None
        self.conv1 = nn.Conv2d(c_in, out, 3, stride, 1, bias=bias)
        if norm:
            self.bn1 = norm(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=bias)
        if norm:
            self.bn2 = norm(out)
        self.norm = norm is not None
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != out:
            layers = [nn.Conv2d(c_in, out, 1, stride, bias=bias)]
            if norm:
                layers.append(norm(out))
            self.shortcut = nn.Sequential(*layers)

    def forward(self, x):
        y = self.conv1(x)
        y = torch.relu(self.bn1(y) if self.norm else y)
        y = self.conv2(y)
        y = self.bn2(y) if self.norm else y
        return torch.relu(y + self.shortcut(x))


class Bottleneck(nn.Module):
    """He et al.'s bottleneck block as torchvision places its stride (on the 3x3 convolution,
    "ResNet v1.5"): 1x1 to `inner`, 3x3 to `middle`, 1x1 to `out`, each with its norm."""

    def __init__(self, c_in, out, stride, norm, inner, middle, project=False):
        super().__init__()
        bias = norm is None
        self.norm = norm is not None
        widths = [(c_in, inner, 1, 1), (inner, middle, 3, stride), (middle, out, 1, 1)]
        for k, (a, b, kernel, st) in enumerate(widths, 1):
            setattr(self, f"conv{k}", nn.Conv2d(a, b, kernel, st, kernel // 2, bias=bias))
            if norm:
                setattr(self, f"bn{k}", norm(b))
        self.shortcut = nn.Sequential()
        if project or stride != 1 or c_in != out:
            layers = [nn.Conv2d(c_in, out, 1, stride, bias=bias)]
            if norm:
                layers.append(norm(out))
            self.shortcut = nn.Sequential(*layers)

    def forward(self, x):
        y = x
        for k in (1, 2, 3):
            y = getattr(self, f"conv{k}")(y)
            if self.norm:
                y = getattr(self, f"bn{k}")(y)
            if k < 3:
                y = torch.relu(y)
        return torch.relu(y + self.shortcut(x))


def cnn_leaf(classes):
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 64, 2048), nn.ReLU(), nn.Linear(2048, classes))


def vgg9(classes):
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Dropout(0.05),
        nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Dropout(0.1), nn.Linear(4096, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.1), nn.Linear(512, classes))


def resnet20(classes, norm, width=16, channels=3):
    makers = {
        "batch": nn.BatchNorm2d,
        "group": lambda c: nn.GroupNorm(2, c),
        "none": None,
    }
    make = makers[norm]
    layers = [nn.Conv2d(channels, width, 3, padding=1, bias=make is None)]
    if make:
        layers.append(make(width))
    layers.append(nn.ReLU())
    c = width
    for stage, stride in [(1, 1), (2, 2), (4, 2)]:
        for block in range(3):
            out = width * stage
            layers.append(Residual(c, out, stride if block == 0 else 1, make))
            c = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return nn.Sequential(*layers)


def from_layers(input_shape, layers):
    """The nn.Sequential that a fedfuse layer list means."""
    shape = list(input_shape)
    mods = []
    for spec in layers:
        t = spec["type"]
        if t == "conv2d":
            c = shape[0]
            k, s, p = spec["kernel"], spec.get("stride", 1), spec.get("padding", 0)
            m = nn.Conv2d(c, spec["out"], k, s, p, groups=spec.get("groups", 1),
                          bias=spec.get("bias", True))
            shape = [spec["out"], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif t in ("maxpool2d", "avgpool2d"):
            k = spec["kernel"]
            s = spec.get("stride", k)
            m = (nn.MaxPool2d if t == "maxpool2d" else nn.AvgPool2d)(k, s)
            shape = [shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1]
        elif t == "global_avgpool":
            m = nn.AdaptiveAvgPool2d(1)
            shape = [shape[0], 1, 1]
        elif t == "batchnorm2d":
            m = nn.BatchNorm2d(shape[0], eps=spec.get("eps", 1e-5), momentum=spec.get("momentum", 0.1))
        elif t == "batchnorm1d":
            m = nn.BatchNorm1d(shape[0], eps=spec.get("eps", 1e-5), momentum=spec.get("momentum", 0.1))
        elif t == "groupnorm":
            m = nn.GroupNorm(spec["groups"], shape[0], eps=spec.get("eps", 1e-5))
        elif t == "layernorm":
            m = nn.LayerNorm(shape, eps=spec.get("eps", 1e-5))
        elif t == "relu":
            m = nn.ReLU()
        elif t == "dropout":
            m = nn.Dropout(spec["p"])
        elif t == "flatten":
            m = nn.Flatten()
            shape = [math.prod(shape)]
        elif t == "linear":
            m = nn.Linear(shape[0], spec["out"], bias=spec.get("bias", True))
            shape = [spec["out"]]
        elif t == "residual":
            norm = spec.get("norm", "batch")
            make = {"batch": nn.BatchNorm2d, "group": lambda c: nn.GroupNorm(spec.get("groups", 2), c),
                    "none": None}[norm]
            s = spec.get("stride", 1)
            m = Residual(shape[0], spec["out"], s, make)
            shape = [spec["out"], (shape[1] - 1) // s + 1, (shape[2] - 1) // s + 1]
        elif t == "bottleneck":
            norm = spec.get("norm", "batch")
            make = {"batch": nn.BatchNorm2d, "group": lambda c: nn.GroupNorm(spec.get("groups", 2), c),
                    "none": None}[norm]
            s = spec.get("stride", 1)
            inner = spec.get("inner", spec["out"] // 4)
            m = Bottleneck(shape[0], spec["out"], s, make, inner, spec.get("middle", inner),
                           spec.get("project", False))
            shape = [spec["out"], (shape[1] - 1) // s + 1, (shape[2] - 1) // s + 1]
        else:
            raise ValueError(t)
        mods.append(m)
    return nn.Sequential(*mods)


CUSTOM = [
    {"type": "conv2d", "out": 6, "kernel": 3, "stride": 2, "padding": 1, "bias": False},
    {"type": "batchnorm2d"},
    {"type": "relu"},
    {"type": "conv2d", "out": 6, "kernel": 3, "padding": 1, "groups": 3},
    {"type": "groupnorm", "groups": 3},
    {"type": "avgpool2d", "kernel": 2},
    {"type": "residual", "out": 8, "stride": 2, "norm": "none"},
    {"type": "layernorm"},
    {"type": "global_avgpool"},
    {"type": "flatten"},
    {"type": "linear", "out": 12, "bias": False},
    {"type": "batchnorm1d", "momentum": 0.2},
    {"type": "relu"},
    {"type": "layernorm", "eps": 1e-3},
    {"type": "linear", "out": 5},
]

# Bottleneck blocks from the list: a stride-1 projection, `inner` and `middle` apart from
# out / 4, group norm and none, a projection kept by `project`, an identity block.
BOTTLENECKS = [
    {"type": "conv2d", "out": 8, "kernel": 3, "padding": 1, "bias": False},
    {"type": "batchnorm2d"},
    {"type": "relu"},
    {"type": "bottleneck", "out": 16},
    {"type": "bottleneck", "out": 16, "stride": 2, "inner": 6, "middle": 10, "norm": "group"},
    {"type": "bottleneck", "out": 16, "inner": 3, "norm": "none", "project": True},
    {"type": "bottleneck", "out": 16, "middle": 2},
    {"type": "global_avgpool"},
    {"type": "flatten"},
    {"type": "linear", "out": 4},
]

# A small torchvision VisionTransformer, and the layer list that is the same network.
VIT = [
    {"type": "tokens", "hidden": 32, "patch": 4},
    {"type": "encoder", "heads": 4, "mlp": 64},
    {"type": "encoder", "heads": 4, "mlp": 64},
    {"type": "class_token"},
    {"type": "layernorm", "eps": 1e-6},
    {"type": "linear", "out": 10},
]


def torchvision_vit(classes):
    import torchvision

    return torchvision.models.VisionTransformer(
        image_size=28, patch_size=4, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64,
        num_classes=classes,
    )


CASES = [
    # name, zoo entry (or None), input shape, classes, norm, module
    ("cnn-leaf", "cnn-leaf", [1, 28, 28], 62, None, lambda: cnn_leaf(62)),
    ("vgg9", "vgg9", [3, 32, 32], 10, None, lambda: vgg9(10)),
    ("resnet20-batch", "resnet20", [3, 32, 32], 100, "batch", lambda: resnet20(100, "batch")),
    ("resnet20-group", "resnet20", [3, 32, 32], 10, "group", lambda: resnet20(10, "group")),
    ("resnet20-none", "resnet20", [3, 32, 32], 10, "none", lambda: resnet20(10, "none")),
    ("custom", None, [3, 12, 12], 5, None, lambda: from_layers([3, 12, 12], CUSTOM)),
    ("custom-bottleneck", None, [3, 10, 10], 4, None,
     lambda: from_layers([3, 10, 10], BOTTLENECKS)),
    # torchvision's own modules: its names, its stem (7x7/2 convolution, padded 3x3/2 max-pool).
    # At 64x64 the last stage's batch norm sees 2x2 places per sample: at 32x32 (one place,
    # three samples) train mode is so ill-conditioned that PyTorch's own float32 and float64
    # logits differ by 3e-4.
    ("resnet18", "resnet18", [3, 64, 64], 10, "batch", lambda: torchvision_resnet("resnet18", 10)),
    ("resnet34", "resnet34", [3, 32, 32], 7, "batch", lambda: torchvision_resnet("resnet34", 7)),
    ("resnet50", "resnet50", [3, 32, 32], 10, "batch", lambda: torchvision_resnet("resnet50", 10)),
    # torchvision's VisionTransformer (eval only: it holds dropout modules, at p = 0).
    ("vit", None, [3, 28, 28], 10, None, lambda: torchvision_vit(10)),
]

LISTS = {"custom": CUSTOM, "custom-bottleneck": BOTTLENECKS, "vit": VIT}

# Cases checked in eval mode only: ResNet-34's and ResNet-50's train-mode statistics would add
# 300 KB and 1 MB for nothing ResNet-18's and custom-bottleneck's do not already check.
EVAL_ONLY = {"resnet34", "resnet50"}


def torchvision_resnet(name, classes):
    import torchvision  # scripts/torch-venv.sh installs it beside torch

    return getattr(torchvision.models, name)(num_classes=classes)


def has_dropout(model):
    return any(isinstance(m, nn.Dropout) for m in model.modules())


def main():
    only = set(sys.argv[1:])
    cases = []
    for name, zoo, shape, classes, norm, make in CASES:
        if only and name not in only:
            continue
        model = make()
        sd = model.state_dict()
        tensors = [(k, list(v.shape)) for k, v in sd.items()]
        new = {k: value(k, s, i) for i, (k, s) in enumerate(tensors)}
        model.load_state_dict(new, strict=True)
        x = inputs(shape)
        model.eval()
        with torch.no_grad():
            logits = model(x)
        case = {
            "name": name,
            "zoo": zoo,
            "input": shape,
            "classes": classes,
            "norm": norm,
            "tensors": [{"name": k, "shape": s, "dtype": str(sd[k].dtype).replace("torch.", "")}
                        for k, s in tensors],
            "num_params": sum(p.numel() for p in model.parameters()),
            "eval_logits": logits.flatten().tolist(),
        }
        if zoo is None:
            case["layers"] = LISTS[name]
        if not has_dropout(model) and name not in EVAL_ONLY:
            model.train()
            with torch.no_grad():
                train_logits = model(x)
            case["train_logits"] = train_logits.flatten().tolist()
            case["after_train"] = {k: v.flatten().tolist() for k, v in model.state_dict().items()
                                   if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
        cases.append(case)
        print(f"{name}: {case['num_params']} parameters, {len(tensors)} tensors")
    if only and os.path.exists(OUT):
        with open(OUT) as f:
            kept = json.load(f)["cases"]
        fresh = {c["name"]: c for c in cases}
        cases = [fresh.pop(c["name"], c) for c in kept] + list(fresh.values())
    with open(OUT, "w") as f:
        json.dump({"torch": torch.__version__, "batch": BATCH, "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
