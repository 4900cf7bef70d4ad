"""Weight matching (Git Re-Basin, Ainsworth et al. 2023) of residual layer lists in numpy: the
yardstick for `fedfuse fuse --method weight-matching` (docs/BENCHMARKS.md, "Weight matching
of residual networks").

The same algorithm on the same permutation groups as crates/fuse/src/matching/
weight_matching.rs, written plainly: the groups are derived from the model TOML's layer list
by the rules of crates/core/src/layers/units.rs (`permutation_groups`), then client B is
aligned to client A by coordinate descent (one bottom-up pass, each group on its own tensors
whose inputs are already aligned; then up to `--max-iters` passes over the groups in a random
order, each group's permutation solved as a linear assignment over all its tensors and kept
only if it raises the sum of inner products), and the two are averaged.

Three commands:

  make OUT_DIR (--width W | --resnet18 | --resnet50) [--seed S] [--noise F]
      writes OUT_DIR/model.toml (the layer list, 3x32x32 inputs), OUT_DIR/a.safetensors
      (random values for every tensor of the layout), OUT_DIR/b.safetensors (A with every
      permutation group permuted at random, plus noise of F times each tensor's spread) and
      OUT_DIR/planted.json (the permutation that aligns B to A, per group).
  fuse A B --model M.toml --out OUT [--seed S] [--max-iters N]
      the reference fusion: writes OUT (safetensors) and OUT.assignments.json.
  check --model M.toml --planted P.json --fedfuse F --reference R
      both recover the planted permutations; the fused tensors agree.

Needs numpy, scipy (linear_sum_assignment) and safetensors.
"""

import argparse
import json
import sys
import tomllib
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

BN = ["weight", "bias", "running_mean", "running_var"]


# --------------------------------------------------------------------------------------------
# Layer lists: shapes, tensors, permutation groups


def read_model(path):
    """(input shape, layer list) of a model TOML."""
    with open(path, "rb") as f:
        model = tomllib.load(f)["model"]
    if model.get("kind", "sequential") not in ("sequential", "resnet20"):
        raise SystemExit(f"{path}: a layer list is needed, not kind {model['kind']!r}")
    return list(model["input"]), model["layers"]


def shapes(input_shape, layers):
    """(c, h, w) or (n,) after each layer, and every tensor's (name, shape) in order."""
    shape = tuple(input_shape)
    after, tensors = [], []

    def bn(prefix, c):
        tensors.extend((f"{prefix}.{t}", (c,)) for t in BN)
        tensors.append((f"{prefix}.num_batches_tracked", ()))

    for i, layer in enumerate(layers):
        kind = layer["type"]
        if kind == "conv2d":
            c, h, w = shape
            k, s, p = layer["kernel"], layer.get("stride", 1), layer.get("padding", 0)
            tensors.append((f"{i}.weight", (layer["out"], c, k, k)))
            if layer.get("bias", True):
                tensors.append((f"{i}.bias", (layer["out"],)))
            shape = (layer["out"], (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)
        elif kind == "batchnorm2d":
            bn(str(i), shape[0])
        elif kind == "relu":
            pass
        elif kind == "residual":
            if layer.get("norm", "batch") != "batch":
                raise SystemExit(f"layers[{i}]: only residual blocks with batch norm")
            c, h, w = shape
            out, s = layer["out"], layer.get("stride", 1)
            tensors.append((f"{i}.conv1.weight", (out, c, 3, 3)))
            bn(f"{i}.bn1", out)
            tensors.append((f"{i}.conv2.weight", (out, out, 3, 3)))
            bn(f"{i}.bn2", out)
            if s != 1 or c != out:
                tensors.append((f"{i}.shortcut.0.weight", (out, c, 1, 1)))
                bn(f"{i}.shortcut.1", out)
            shape = (out, (h - 1) // s + 1, (w - 1) // s + 1)
        elif kind == "bottleneck":
            if layer.get("norm", "batch") != "batch" or layer.get("groups", 1) != 1:
                raise SystemExit(f"layers[{i}]: only bottlenecks with batch norm and groups = 1")
            c, h, w = shape
            out, s = layer["out"], layer.get("stride", 1)
            inner = layer.get("inner", out // 4)
            middle = layer.get("middle", inner)
            tensors.append((f"{i}.conv1.weight", (inner, c, 1, 1)))
            bn(f"{i}.bn1", inner)
            tensors.append((f"{i}.conv2.weight", (middle, inner, 3, 3)))
            bn(f"{i}.bn2", middle)
            tensors.append((f"{i}.conv3.weight", (out, middle, 1, 1)))
            bn(f"{i}.bn3", out)
            if projection(c, layer):
                tensors.append((f"{i}.shortcut.0.weight", (out, c, 1, 1)))
                bn(f"{i}.shortcut.1", out)
            shape = (out, (h - 1) // s + 1, (w - 1) // s + 1)
        elif kind == "global_avgpool":
            shape = (shape[0], 1, 1)
        elif kind == "flatten":
            shape = (int(np.prod(shape)),)
        elif kind == "linear":
            tensors.append((f"{i}.weight", (layer["out"], shape[0])))
            if layer.get("bias", True):
                tensors.append((f"{i}.bias", (layer["out"],)))
            shape = (layer["out"],)
        else:
            raise SystemExit(f"layers[{i}]: layer type {kind!r} is not covered here")
        after.append(shape)
    return after, tensors


def projection(c_in, layer):
    return layer.get("stride", 1) != 1 or c_in != layer["out"] or layer.get("project", False)


BLOCKS = ("residual", "bottleneck")


def last_conv(layer):
    """The block's convolution that writes its output stream."""
    return "conv3" if layer["type"] == "bottleneck" else "conv2"


def permutation_groups(input_shape, layers):
    """The groups, in fedfuse's order: each {"units", "own": [(tensor, block)] (axis 0),
    "readers": [(tensor, block)] (axis 1), "name": its first own tensor}. A stage's stream
    (its writer, every block's conv2/bn2, the projection) with its readers is one group; a
    block's inner channels another."""
    after, _ = shapes(input_shape, layers)
    c_in = lambda j: (after[j - 1] if j else tuple(input_shape))[0]  # noqa: E731
    weighted = [i for i, l in enumerate(layers) if l["type"] in ("conv2d", "linear")]
    last = weighted[-1] if weighted else None
    groups = []

    def follow(group, start):
        """Walk a stream from layer `start` to its readers (False: nothing reads it)."""
        block = 1
        for j in range(start, len(layers)):
            layer, kind = layers[j], layers[j]["type"]
            if kind in BLOCKS:
                group["readers"].append((f"{j}.conv1.weight", block))
                if projection(c_in(j), layer):
                    group["readers"].append((f"{j}.shortcut.0.weight", block))
                    return True
                conv = last_conv(layer)
                group["own"].append((f"{j}.{conv}.weight", 1))
                group["own"].extend((f"{j}.bn{conv[-1]}.{t}", 1) for t in BN)
                continue
            if kind in ("conv2d", "linear"):
                group["readers"].append((f"{j}.weight", block))
                return True
            if kind == "flatten" and len(after[j - 1]) == 3:
                block *= after[j - 1][1] * after[j - 1][2]
            elif kind == "batchnorm2d":
                group["own"].extend((f"{j}.{t}", block) for t in BN)
        return False

    for i, layer in enumerate(layers):
        kind = layer["type"]
        if kind in BLOCKS:
            out = layer["out"]
            if kind == "residual":
                inners = [out]
            else:
                inner = layer.get("inner", out // 4)
                inners = [inner, layer.get("middle", inner)]
            for k, units in enumerate(inners, start=1):
                group = {"name": f"{i}.conv{k}.weight", "units": units}
                group["readers"] = [(f"{i}.conv{k + 1}.weight", 1)]
                group["own"] = [(f"{i}.conv{k}.weight", 1)] + [(f"{i}.bn{k}.{t}", 1) for t in BN]
                groups.append(group)
            if projection(c_in(i), layer):
                conv = last_conv(layer)
                stream = {"name": f"{i}.{conv}.weight", "units": out, "readers": []}
                stream["own"] = [(f"{i}.{conv}.weight", 1)]
                stream["own"] += [(f"{i}.bn{conv[-1]}.{t}", 1) for t in BN]
                stream["own"].append((f"{i}.shortcut.0.weight", 1))
                stream["own"].extend((f"{i}.shortcut.1.{t}", 1) for t in BN)
                if follow(stream, i + 1):
                    groups.append(stream)
        elif kind in ("conv2d", "linear") and i != last:
            group = {"name": f"{i}.weight", "units": layer["out"], "readers": []}
            group["own"] = [(f"{i}.weight", 1)]
            if layer.get("bias", True):
                group["own"].append((f"{i}.bias", 1))
            if follow(group, i + 1):
                groups.append(group)
    return groups


def is_param(name):
    """Weights, biases, norm scales and shifts; not batch norm's running statistics."""
    return not name.endswith(("running_mean", "running_var", "num_batches_tracked"))


# --------------------------------------------------------------------------------------------
# Moving units


def move_axis0(t, perm, block):
    """Unit u (rows u*block..) moved to position perm[u]."""
    out = np.empty_like(t)
    v, o = t.reshape(len(perm), block, -1), out.reshape(len(perm), block, -1)
    o[perm] = v
    return out


def move_axis1(t, perm, block):
    """Input unit u (columns u*block..) moved to position perm[u]."""
    out = np.empty_like(t)
    v = t.reshape(t.shape[0], len(perm), block, -1)
    o = out.reshape(t.shape[0], len(perm), block, -1)
    o[:, perm] = v
    return out


def permute_model(params, groups, perms):
    """A copy of `params` with group g's unit u moved to perms[g][u], in every tensor."""
    out = dict(params)
    for g, perm in zip(groups, perms):
        perm = np.asarray(perm)
        for name, block in g["own"]:
            out[name] = move_axis0(out[name], perm, block)
        for name, block in g["readers"]:
            out[name] = move_axis1(out[name], perm, block)
    return out


# --------------------------------------------------------------------------------------------
# Weight matching


def align(ref, cli, groups, max_iters, rng):
    """One permutation per group taking B's units onto A's (perm[u] = A's unit of B's u)."""
    from scipy.optimize import linear_sum_assignment

    rows = {n: g for g, grp in enumerate(groups) for n, _ in grp["own"]}
    cols = {n: g for g, grp in enumerate(groups) for n, _ in grp["readers"]}
    perms = [np.arange(grp["units"]) for grp in groups]

    def similarity(g, aligned=None):
        """n x n: sum over the group's tensors of <A's unit a, B's unit b>, B's other axes put
        in A's order by the current permutations (with `aligned`: own tensors whose inputs are
        aligned only)."""
        grp = groups[g]
        n = grp["units"]
        cost = np.zeros((n, n))
        for name, block in grp["own"]:
            if not is_param(name):
                continue
            if aligned is not None and name in cols and not aligned[cols[name]]:
                continue
            a, b = ref[name], cli[name]
            if name in cols:  # its inputs: another group's units
                h = cols[name]
                b = move_axis1(b, perms[h], dict(groups[h]["readers"])[name])
            cost += a.reshape(n, -1) @ b.reshape(n, -1).T
        if aligned is None:
            for name, block in grp["readers"]:
                a, b = ref[name], cli[name]
                if name in rows:  # its rows: another group's units
                    h = rows[name]
                    b = move_axis0(b, perms[h], 1)
                a = np.moveaxis(a.reshape(a.shape[0], n, -1), 1, 0).reshape(n, -1)
                b = np.moveaxis(b.reshape(b.shape[0], n, -1), 1, 0).reshape(n, -1)
                cost += a @ b.T
        return cost

    def solve(cost):
        ra, cb = linear_sum_assignment(cost, maximize=True)
        perm = np.empty(len(cb), dtype=np.int64)
        perm[cb] = ra
        return perm

    aligned = [False] * len(groups)
    for g in range(len(groups)):
        perms[g] = solve(similarity(g, aligned))
        aligned[g] = True
    passes = 0
    for _ in range(max_iters):
        passes += 1
        improved = False
        for g in rng.permutation(len(groups)):
            cost = similarity(g)
            perm = solve(cost)
            idx = np.arange(len(perm))
            old, new = cost[perms[g], idx].sum(), cost[perm, idx].sum()
            if new > old + 1e-12 * max(abs(old), 1.0):
                perms[g] = perm
                improved = True
        if not improved:
            break
    return perms, passes


def fuse(args):
    input_shape, layers = read_model(args.model)
    groups = permutation_groups(input_shape, layers)
    a, b = load_file(args.a), load_file(args.b)
    ref = {k: v.astype(np.float64) for k, v in a.items() if is_param(k)}
    cli = {k: v.astype(np.float64) for k, v in b.items() if is_param(k)}
    perms, passes = align(ref, cli, groups, args.max_iters, np.random.default_rng(args.seed))
    b = permute_model(b, groups, perms)
    fused = {}
    for name, t in a.items():
        mean = 0.5 * t.astype(np.float64) + 0.5 * b[name].astype(np.float64)
        if name.endswith("num_batches_tracked"):
            mean = np.round(mean)
        fused[name] = mean.astype(t.dtype)
    out = Path(args.out)
    save_file(fused, str(out), metadata={"fedfuse.order": json.dumps(list(a))})
    report = {
        "method": "weight-matching (numpy reference)",
        "passes": passes,
        "groups": [
            {
                "name": g["name"],
                "units": g["units"],
                "assignments": [list(range(g["units"])), p.tolist()],
            }
            for g, p in zip(groups, perms)
        ],
    }
    out.with_suffix(".assignments.json").write_text(json.dumps(report, indent=1))
    print(f"aligned {len(groups)} groups in {passes} passes; wrote {out}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Test models and the check


def resnet_layers(stem, stages, blocks, classes=10, kind="residual"):
    """A CIFAR-stem ResNet: `blocks` blocks of `kind` per stage (an int, or one per stage)."""
    layers = [
        {"type": "conv2d", "out": stem, "kernel": 3, "stride": 1, "padding": 1, "bias": False},
        {"type": "batchnorm2d"},
        {"type": "relu"},
    ]
    per_stage = blocks if isinstance(blocks, list) else [blocks] * len(stages)
    for s, (width, n) in enumerate(zip(stages, per_stage)):
        for k in range(n):
            stride = 2 if s > 0 and k == 0 else 1
            layers.append({"type": kind, "out": width, "stride": stride, "norm": "batch"})
    layers += [{"type": "global_avgpool"}, {"type": "flatten"}, {"type": "linear", "out": classes}]
    return layers


def toml_value(v):
    return f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def make(args):
    if args.resnet18:
        layers = resnet_layers(64, [64, 128, 256, 512], 2)
    elif args.resnet50:
        layers = resnet_layers(64, [256, 512, 1024, 2048], [3, 4, 6, 3], kind="bottleneck")
    else:
        w = args.width
        layers = resnet_layers(w, [w, 2 * w, 4 * w], 3)
    input_shape = [3, 32, 32]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["[model]", 'kind = "sequential"', f"input = {input_shape}", ""]
    for layer in layers:
        lines.append("[[model.layers]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in layer.items()]
        lines.append("")
    (out / "model.toml").write_text("\n".join(lines))
    _, tensors = shapes(input_shape, layers)
    rng = np.random.default_rng(args.seed)
    a = {}
    for name, shape in tensors:
        if name.endswith("num_batches_tracked"):
            a[name] = np.array(100, dtype=np.int64)
        elif name.endswith("running_var"):
            a[name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        elif len(shape) > 1:
            fan_in = int(np.prod(shape[1:]))
            a[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        elif name.endswith("weight"):
            a[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            a[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    groups = permutation_groups(input_shape, layers)
    order = {"fedfuse.order": json.dumps([n for n, _ in tensors])}
    save_file(a, str(out / "a.safetensors"), metadata=order)
    # B's unit u is A's unit sigma[u]: moving B's unit u to sigma[u] gives A back. With
    # --copies N, b2 ... bN are further permuted, noisy copies (PFNM's many-client benchmark).
    for k in range(1, args.copies + 1):
        sigmas = [rng.permutation(g["units"]) for g in groups]
        inverse = [np.argsort(s) for s in sigmas]
        b = permute_model(a, groups, inverse)
        for name, t in b.items():
            if t.dtype == np.float32 and not name.endswith(("running_mean", "running_var")):
                noise = args.noise * t.std() * rng.standard_normal(t.shape)
                b[name] = (t + noise).astype(np.float32)
        save_file(b, str(out / ("b.safetensors" if k == 1 else f"b{k}.safetensors")), metadata=order)
        if k == 1:
            planted_sigmas = sigmas
    sigmas = planted_sigmas
    planted = [
        {"name": g["name"], "units": g["units"], "perm": s.tolist()} for g, s in zip(groups, sigmas)
    ]
    (out / "planted.json").write_text(json.dumps(planted))
    params = sum(int(np.prod(s)) for n, s in tensors if is_param(n))
    print(f"{out}: {len(layers)} layers, {len(groups)} permutation groups, {params} parameters")


def check(args):
    planted = json.loads(Path(args.planted).read_text())
    def report(fused):
        return json.loads(Path(fused).with_suffix(".assignments.json").read_text())

    ours = report(args.reference)["groups"]
    theirs = report(args.fedfuse)["layers"]  # one entry per permutation group, in order
    ok = [t["tensor"] for t in theirs] == [p["name"] for p in planted]
    if not ok:
        print(f"fedfuse's groups {[t['tensor'] for t in theirs]} are not the reference's")
    wrong_ref = [p["name"] for p, o in zip(planted, ours) if o["assignments"][1] != p["perm"]]
    print(f"reference: {len(planted) - len(wrong_ref)}/{len(planted)} planted permutations found")
    ok &= not wrong_ref and len(ours) == len(planted)
    got = [t["assignments"][1] for t in theirs]
    wrong_ff = [p["name"] for p, g in zip(planted, got) if g != p["perm"]]
    print(f"fedfuse:   {len(planted) - len(wrong_ff)}/{len(planted)} planted permutations found")
    ok &= not wrong_ff and len(got) == len(planted)
    f, r = load_file(args.fedfuse), load_file(args.reference)
    if set(f) != set(r):
        print(f"tensor names differ: {sorted(set(f) ^ set(r))}")
        ok = False
    worst, name_at, identical = 0.0, None, 0
    for name in sorted(set(f) & set(r)):
        if f[name].shape != r[name].shape:
            print(f"{name}: shape {f[name].shape} against {r[name].shape}")
            ok = False
            continue
        diff = np.abs(f[name].astype(np.float64) - r[name].astype(np.float64))
        d = float(np.max(diff, initial=0.0))
        identical += d == 0.0
        if d > worst:
            worst, name_at = d, name
    print(f"fused tensors: {identical}/{len(f)} bit-identical, largest difference {worst:.3g}"
          + (f" ({name_at})" if name_at else ""))
    ok &= worst <= 1e-6
    print("EQUAL" if ok else "DIFFERENT")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out_dir")
    m.add_argument("--width", type=int, default=16)
    m.add_argument("--resnet18", action="store_true")
    m.add_argument("--resnet50", action="store_true")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--noise", type=float, default=0.05)
    m.add_argument("--copies", type=int, default=1)
    f = sub.add_parser("fuse")
    f.add_argument("a")
    f.add_argument("b")
    f.add_argument("--model", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--max-iters", type=int, default=100)
    c = sub.add_parser("check")
    c.add_argument("--model", required=True)
    c.add_argument("--planted", required=True)
    c.add_argument("--fedfuse", required=True)
    c.add_argument("--reference", required=True)
    args = p.parse_args()
    if args.cmd == "make":
        make(args)
    elif args.cmd == "fuse":
        fuse(args)
    else:
        sys.exit(check(args))


if __name__ == "__main__":
    main()
