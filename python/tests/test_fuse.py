"""`fedfuse.fuse` against `fedfuse fuse` on the PFNM reference fixtures, and its errors."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import fedfuse
from conftest import SHARED

FIXTURES = sorted((SHARED / "fixtures" / "pfnm").glob("*.json"))


def models_of(fixture):
    """The fixture's client networks as PyTorch state_dicts (weights [out, in])."""
    models = []
    for net in fixture["client_weights"]:
        m = {}
        for layer in range(len(net) // 2):
            m[f"layers.{layer}.weight"] = np.asarray(net[2 * layer], dtype=np.float32).T.copy()
            m[f"layers.{layer}.bias"] = np.asarray(net[2 * layer + 1], dtype=np.float32)
        models.append(m)
    return models


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@pytest.mark.parametrize("method,eps,order", [
    ("pfnm", 0.0, "top_down"),
    ("pfnm", 0.0, "bottom_up"),
    ("gpi-fnm", 0.05, "top_down"),
    ("fedavg", 0.0, "top_down"),
])
def test_fuse_equals_the_command_line_bit_for_bit(path, method, eps, order, tmp_path,
                                                  fedfuse_bin):
    f = json.loads(path.read_text())
    models = models_of(f)
    if method == "fedavg" and len({m["layers.0.weight"].shape for m in models}) > 1:
        pytest.skip("fedavg needs equal widths")
    files = []
    for j, m in enumerate(models):
        files.append(tmp_path / f"client{j}.safetensors")
        save_file(m, str(files[-1]))
    counts = tmp_path / "counts.json"
    counts.write_text(json.dumps(f["batch_frequencies"]))
    out = tmp_path / "fused.safetensors"
    settings = dict(sigma=f["sigma"], sigma0=f["sigma0"], gamma=f["gamma"], iters=f["it"], seed=7,
                    order=order)
    args = [str(fedfuse_bin), "fuse", *map(str, files), "--out", str(out), "--method", method,
            "--class-counts", str(counts), "--eps", str(eps)]
    for key, value in settings.items():
        args += [f"--{key}", str(value)]
    subprocess.run(args, check=True, capture_output=True)
    fused, report = fedfuse.fuse(models, method=method, class_counts=f["batch_frequencies"],
                                 eps=eps, **settings)
    from_cli = load_file(str(out))
    assert list(fused) == [k for k in models[0]]
    assert set(from_cli) == set(fused)
    for key, value in fused.items():
        assert value.dtype == np.float32 and value.shape == from_cli[key].shape
        assert value.tobytes() == from_cli[key].tobytes(), key
    cli_report = json.loads((tmp_path / "fused.assignments.json").read_text())
    assert report["layers"] == cli_report["layers"]
    assert report["fused_widths"] == cli_report["fused_widths"]


def test_one_pass_pfnm_matches_the_reference_global_model():
    f = json.loads((SHARED / "fixtures" / "pfnm" / "one_layer_it0.json").read_text())
    fused, _ = fedfuse.fuse(models_of(f), class_counts=f["batch_frequencies"], sigma=f["sigma"],
                            sigma0=f["sigma0"], gamma=f["gamma"], iters=0)
    want = [np.asarray(w) for w in f["global_weights"]]
    np.testing.assert_allclose(fused["layers.0.weight"], want[0].T, atol=1e-5)
    np.testing.assert_allclose(fused["layers.1.bias"], want[3], atol=1e-5)


def test_bad_models_name_what_is_wrong():
    good = {"layers.0.weight": np.zeros((3, 4), np.float32), "layers.0.bias": np.zeros(3, np.float32),
            "layers.1.weight": np.zeros((2, 3), np.float32), "layers.1.bias": np.zeros(2, np.float32)}
    nan = dict(good, **{"layers.1.weight": np.full((2, 3), np.nan, np.float32)})
    with pytest.raises(fedfuse.FedfuseError, match="model 1"):
        fedfuse.fuse([good, nan])
    with pytest.raises(fedfuse.FedfuseError, match="gpi-fnm needs eps > 0"):
        fedfuse.fuse([good, good], method="gpi-fnm")
    with pytest.raises(fedfuse.FedfuseError, match="method"):
        fedfuse.fuse([good, good], method="fedma")
    with pytest.raises(fedfuse.FedfuseError, match="dtype int64"):
        fedfuse.fuse([good, dict(good, **{"layers.0.bias": np.zeros(3, np.int64)})])
    with pytest.raises(fedfuse.FedfuseError, match="class-count lists"):
        fedfuse.fuse([good, good], class_counts=[[1, 2]])


def test_a_nested_pytorch_naming_saved_as_safetensors_fuses_as_layers_do(tmp_path, fedfuse_bin):
    # `net.0`, `net.2`, `classifier`: safetensors sorts these names (classifier first); the
    # command line puts the layers back in the order their widths chain in, and keeps the names.
    f = json.loads(FIXTURES[0].read_text())
    models = models_of(f)
    rename = {}
    depth = len(models[0]) // 2
    for layer in range(depth):
        own = "classifier" if layer == depth - 1 else f"net.{2 * layer}"
        rename[f"layers.{layer}.weight"] = f"{own}.weight"
        rename[f"layers.{layer}.bias"] = f"{own}.bias"
    files = []
    for j, m in enumerate(models):
        files.append(tmp_path / f"client{j}.safetensors")
        save_file({rename[k]: v for k, v in m.items()}, str(files[-1]))
    out = tmp_path / "fused.safetensors"
    subprocess.run([str(fedfuse_bin), "fuse", *map(str, files), "--out", str(out), "--seed", "7"],
                   check=True, capture_output=True)
    want, _ = fedfuse.fuse(models, seed=7)
    got = load_file(str(out))
    assert set(got) == set(rename.values())
    for key, value in want.items():
        assert got[rename[key]].tobytes() == value.tobytes(), key


# A CNN under named modules, as a PyTorch class would register them:
# conv1 (4 filters 3x3, padding 1), bn1, relu, pool 2, conv2 (6), relu, pool 2, flatten (6
# channels of 2x2), fc1 (8), relu, fc2 (3), on 1x8x8 samples.
CNN_TOML = """
[model]
kind = "sequential"
input = [1, 8, 8]
layers = [
    { type = "conv2d", out = 4, kernel = 3, padding = 1 },
    { type = "batchnorm2d" },
    { type = "relu" },
    { type = "maxpool2d", kernel = 2 },
    { type = "conv2d", out = 6, kernel = 3, padding = 1 },
    { type = "relu" },
    { type = "maxpool2d", kernel = 2 },
    { type = "flatten" },
    { type = "linear", out = 8 },
    { type = "relu" },
    { type = "linear", out = 3 },
]
"""


def cnn(rng):
    f = lambda *shape: rng.normal(0, 0.5, shape).astype(np.float32)  # noqa: E731
    return {
        "conv1.weight": f(4, 1, 3, 3), "conv1.bias": f(4),
        "bn1.weight": rng.uniform(0.5, 1.5, 4).astype(np.float32), "bn1.bias": f(4),
        "bn1.running_mean": f(4), "bn1.running_var": rng.uniform(0.5, 2, 4).astype(np.float32),
        "bn1.num_batches_tracked": np.array(321, np.int64),
        "conv2.weight": f(6, 4, 3, 3), "conv2.bias": f(6),
        "fc1.weight": f(8, 24), "fc1.bias": f(8),
        "fc2.weight": f(3, 8), "fc2.bias": f(3),
    }


def permuted_cnn(m, rng):
    """``m`` with conv1's, conv2's and fc1's units permuted, everything that reads them too."""
    p1, p2, p3 = rng.permutation(4), rng.permutation(6), rng.permutation(8)
    q = dict(m)
    for k in ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean",
              "bn1.running_var"]:
        q[k] = m[k][p1]
    q["conv2.weight"] = m["conv2.weight"][p2][:, p1]
    q["conv2.bias"] = m["conv2.bias"][p2]
    # fc1 reads conv2's channels as blocks of 2x2 after the flatten.
    q["fc1.weight"] = m["fc1.weight"].reshape(8, 6, 4)[p3][:, p2].reshape(8, 24)
    q["fc1.bias"] = m["fc1.bias"][p3]
    q["fc2.weight"] = m["fc2.weight"][:, p3]
    # Indexing along axis 1 leaves Fortran-ordered arrays, which safetensors' numpy writer
    # stores in memory order.
    return {k: np.asarray(v, order="C") for k, v in q.items()}


@pytest.mark.parametrize("method,extra", [
    ("pfnm", dict(sigma=1e-4)),
    ("weight-matching", {}),
])
def test_fuse_with_a_model_gives_permuted_cnns_back_as_the_command_line_does(
        method, extra, tmp_path, fedfuse_bin):
    rng = np.random.default_rng(3)
    m = cnn(rng)
    models = [m, permuted_cnn(m, rng), permuted_cnn(m, rng)]
    toml = tmp_path / "cnn.toml"
    toml.write_text(CNN_TOML)
    fused, report = fedfuse.fuse(models, method=method, model=toml, seed=5, **extra)
    assert list(fused) == list(m)
    for k, v in m.items():
        assert fused[k].dtype == v.dtype and fused[k].shape == v.shape, k
        np.testing.assert_allclose(fused[k], v, rtol=1e-3, atol=1e-3, err_msg=k)
    assert fused["bn1.num_batches_tracked"] == 321
    assert report["fused_widths"] == [1, 4, 6, 8, 3]
    assert report["metadata"]["fedfuse.widths"] == "[1,4,6,8,3]"
    assert report["model"]["kind"] == "sequential" and report["model"]["input"] == [1, 8, 8]
    assert [layer["tensor"] for layer in report["layers"]] == [
        "conv1.weight", "conv2.weight", "fc1.weight"]

    # The command line on the same state dicts saved by safetensors (int64 counters, sorted
    # names): the same bytes, the same header.
    files = []
    for j, model in enumerate(models):
        files.append(tmp_path / f"client{j}.safetensors")
        save_file(model, str(files[-1]))
    out = tmp_path / "fused.safetensors"
    subprocess.run([str(fedfuse_bin), "fuse", *map(str, files), "--out", str(out), "--method",
                    method, "--model", str(toml), "--seed", "5",
                    *[a for k, v in extra.items() for a in (f"--{k}", str(v))]],
                   check=True, capture_output=True)
    from_cli = load_file(str(out))
    assert set(from_cli) == set(fused)
    for k, v in fused.items():
        assert from_cli[k].dtype == v.dtype and from_cli[k].tobytes() == v.tobytes(), k
    from safetensors import safe_open
    with safe_open(str(out), "np") as f:
        meta = f.metadata()
    for key, value in report["metadata"].items():
        assert meta[key] == value, key


def test_cnns_without_a_model_or_not_fitting_it_are_refused(tmp_path):
    m = cnn(np.random.default_rng(0))
    toml = tmp_path / "cnn.toml"
    toml.write_text(CNN_TOML)
    with pytest.raises(fedfuse.FedfuseError, match="model="):
        fedfuse.fuse([m, m])
    with pytest.raises(fedfuse.FedfuseError, match="lenet5, cnn-leaf"):
        fedfuse.fuse([m, m], model="lenet")
    with pytest.raises(fedfuse.FedfuseError, match="model 1.*conv2.weight"):
        fedfuse.fuse([m, dict(m, **{"conv2.weight": np.zeros((6, 4, 5, 5), np.float32)})],
                     model=toml)
    with pytest.raises(fedfuse.FedfuseError, match="model 1.*running_mean"):
        fedfuse.fuse([m, {k: v for k, v in m.items() if not k.startswith("bn1")}], model=toml)


# Two PyTorch CNNs with batch norm (different seeds, label-skewed halves of an MNIST slice),
# trained by scripts/fuse_torch_cnns.py, which recorded each fusion's widths and the accuracy
# PyTorch measured on the fused file (loaded with strict=True) on the first 2000 MNIST test
# images: facts.json. No torch here.
TORCH_CNNS = Path(__file__).resolve().parent / "fixtures" / "torch_cnns"
MNIST = SHARED / "data" / "mnist"
# Bounds that hold where the method works (facts.json's accuracies: clients 0.931 and 0.939;
# PFNM at its defaults 0.519, PFNM with sigma 0.1 0.9095, weight matching 0.8855, FedAvg 0.4565).
FUSED_AT_LEAST = {"pfnm": 0.3, "pfnm-sigma0.1": 0.88, "weight-matching": 0.85, "fedavg": 0.1}
STATE_DICT_LEAVES = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"


def mnist_accuracy(model, layers, tmp_path):
    """fedfuse's accuracy of ``model`` (an nn.Sequential state_dict of ``layers``) on the first
    2000 MNIST test images: the server evaluation of a run config, as Flower strategies get it."""
    from flwr.app import Array, ArrayRecord

    from fedfuse.flwr import evaluate_fn

    config = tmp_path / "score.toml"
    config.write_text(
        f"seed = 0\nrounds = 1\nclients = 1\ndata_dir = {json.dumps(str(MNIST))}\n\n"
        '[dataset]\nname = "mnist"\ntrain_samples = 100\ntest_samples = 2000\n\n'
        '[method]\nname = "fedavg"\n\n'
        f'[model]\nkind = "sequential"\nlayers = {toml_value(layers)}\n')
    # The model's own order: layer by layer, PyTorch's order of a layer's tensors.
    order = sorted(model, key=lambda k: (int(k.split(".")[0]),
                                         STATE_DICT_LEAVES.index(k.split(".")[1])))
    arrays = ArrayRecord({k: Array(np.asarray(model[k], np.float32)) for k in order})
    return evaluate_fn(config)(0, arrays)["accuracy"]


@pytest.mark.parametrize("name", list(FUSED_AT_LEAST))
def test_pytorch_cnns_fused_score_what_pytorch_measured_on_the_fused_file(name, tmp_path):
    facts = json.loads((TORCH_CNNS / "facts.json").read_text())
    run = next(r for r in facts["fused"] if r["name"] == name)
    models = [load_file(str(TORCH_CNNS / c["file"])) for c in facts["clients"]]
    fused, report = fedfuse.fuse(models, method=run["method"], class_counts=facts["class_counts"],
                                 model=TORCH_CNNS / "cnn.toml", **run["settings"])
    assert report["fused_widths"] == run["widths"]
    assert fused["1.num_batches_tracked"].dtype == np.int64
    accuracy = mnist_accuracy(fused, report["model"]["layers"], tmp_path)
    # The fusion is deterministic and every test image's two top logits were at least
    # run["min_logit_margin"] (>= 6e-5) apart in PyTorch, far above float32 rounding, so
    # fedfuse must score exactly what PyTorch measured.
    assert abs(accuracy - run["accuracy"]) <= 1e-6, (accuracy, run["accuracy"])
    assert min(c["accuracy"] for c in facts["clients"]) > 0.9
    assert accuracy >= FUSED_AT_LEAST[name]
    fedavg = next(r["accuracy"] for r in facts["fused"] if r["name"] == "fedavg")
    if name in ("pfnm-sigma0.1", "weight-matching"):
        assert accuracy > fedavg + 0.3
    if name == "pfnm-sigma0.1":
        # Matched, not stacked: every hidden layer wider than a client's (units opened) and
        # narrower than the two side by side (units merged).
        client = report["input_widths"][0][1:-1]
        assert all(c < w < 2 * c for c, w in zip(client, run["widths"][1:-1]))


RESNET_TOML = """
[model]
kind = "sequential"
input = [1, 6, 6]
layers = [
  { type = "conv2d", out = 4, kernel = 3, padding = 1 },
  { type = "batchnorm2d" },
  { type = "relu" },
  { type = "residual", out = 4 },
  { type = "global_avgpool" },
  { type = "flatten" },
  { type = "linear", out = 3 },
]
"""


def _resnet_arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {"0.weight": (4, 1, 3, 3), "0.bias": (4,), "6.weight": (3, 4), "6.bias": (3,)}
    for norm in ("1", "3.bn1", "3.bn2"):
        for t in ("weight", "bias", "running_mean"):
            shapes[f"{norm}.{t}"] = (4,)
        shapes[f"{norm}.running_var"] = (4,)
    shapes["3.conv1.weight"] = (4, 4, 3, 3)
    shapes["3.conv2.weight"] = (4, 4, 3, 3)
    arrays = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    for norm in ("1", "3.bn1", "3.bn2"):
        arrays[f"{norm}.running_var"] = np.abs(arrays[f"{norm}.running_var"]) + 0.5
        arrays[f"{norm}.num_batches_tracked"] = np.array(9, dtype=np.int64)
    return arrays


def test_weight_matching_fuses_a_residual_list_and_resets_its_batch_norms(tmp_path):
    """A residual stage's stream is matched as one group (its report lists the block's conv2
    beside the stem), and ``reset_bn`` re-estimates every batch norm on the inputs given:
    new statistics, one counted batch per pass, nothing else changed."""
    toml = tmp_path / "resnet.toml"
    toml.write_text(RESNET_TOML)
    a = _resnet_arrays(np.random.default_rng(0))
    ordered = {k: a[k] for k in [
        "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
        "1.num_batches_tracked", "3.conv1.weight", "3.bn1.weight", "3.bn1.bias",
        "3.bn1.running_mean", "3.bn1.running_var", "3.bn1.num_batches_tracked",
        "3.conv2.weight", "3.bn2.weight", "3.bn2.bias", "3.bn2.running_mean",
        "3.bn2.running_var", "3.bn2.num_batches_tracked", "6.weight", "6.bias"]}
    plain, report = fedfuse.fuse([ordered, ordered], method="weight-matching", model=toml)
    stream = report["layers"][0]
    assert "3.conv2.weight" in stream["holds"] and "0.weight" in stream["holds"]
    assert stream["read_by"] == ["3.conv1.weight", "6.weight"]
    np.testing.assert_allclose(plain["1.running_mean"], a["1.running_mean"], rtol=1e-6)
    samples = np.random.default_rng(1).normal(size=(10, 1, 6, 6)).astype(np.float32)
    reset, _ = fedfuse.fuse([ordered, ordered], method="weight-matching", model=toml,
                            reset_bn=samples, reset_bn_batch=4)
    for norm in ("1", "3.bn1", "3.bn2"):
        assert not np.allclose(reset[f"{norm}.running_mean"], a[f"{norm}.running_mean"])
        assert int(reset[f"{norm}.num_batches_tracked"]) == 3  # 4 + 4 + 2 samples
    np.testing.assert_allclose(reset["0.weight"], a["0.weight"], rtol=1e-6)
    with pytest.raises(fedfuse.FedfuseError, match="reset_bn"):
        fedfuse.fuse([ordered, ordered], method="weight-matching", model=toml,
                     reset_bn=samples[:, :, :5, :])


def _torchvision_resnet18(rng: np.random.Generator, width: int = 4, channels: int = 1,
                          classes: int = 3) -> dict[str, np.ndarray]:
    """A ``torchvision.models.resnet18`` state_dict at a smaller width, under torchvision's
    names and in its order, with random values."""
    arrays: dict[str, np.ndarray] = {}

    def conv(name: str, out: int, inp: int, k: int) -> None:
        scale = np.sqrt(2.0 / (inp * k * k))
        arrays[f"{name}.weight"] = (rng.normal(size=(out, inp, k, k)) * scale).astype(np.float32)

    def bn(name: str, c: int) -> None:
        arrays[f"{name}.weight"] = (1 + 0.1 * rng.normal(size=c)).astype(np.float32)
        arrays[f"{name}.bias"] = (0.1 * rng.normal(size=c)).astype(np.float32)
        arrays[f"{name}.running_mean"] = (0.1 * rng.normal(size=c)).astype(np.float32)
        arrays[f"{name}.running_var"] = (1 + rng.random(c)).astype(np.float32)
        arrays[f"{name}.num_batches_tracked"] = np.array(9, dtype=np.int64)

    conv("conv1", width, channels, 7)
    bn("bn1", width)
    c = width
    for stage, mult in enumerate([1, 2, 4, 8], start=1):
        for block in range(2):
            out, stride = width * mult, 2 if block == 0 and stage > 1 else 1
            prefix = f"layer{stage}.{block}"
            conv(f"{prefix}.conv1", out, c, 3)
            bn(f"{prefix}.bn1", out)
            conv(f"{prefix}.conv2", out, out, 3)
            bn(f"{prefix}.bn2", out)
            if stride != 1 or c != out:
                conv(f"{prefix}.downsample.0", out, c, 1)
                bn(f"{prefix}.downsample.1", out)
            c = out
    arrays["fc.weight"] = rng.normal(size=(classes, c)).astype(np.float32)
    arrays["fc.bias"] = rng.normal(size=classes).astype(np.float32)
    return arrays


def test_torchvision_resnet18_state_dicts_fuse_by_name_and_reset_at_the_samples_side():
    """``model="resnet18"`` reads torchvision's names (122 tensors at any width), gives them
    back under the same names, and re-estimates batch norm on 20x20 samples: the network was
    read at the first side its tensors fit, and the samples' side gives the same tensors."""
    a = _torchvision_resnet18(np.random.default_rng(3))
    assert len(a) == 122
    fused, report = fedfuse.fuse([a, a], method="weight-matching", model="resnet18")
    assert list(fused) == list(a)
    for name, value in a.items():
        np.testing.assert_allclose(fused[name], value, rtol=1e-6, err_msg=name)
    stem = report["layers"][0]
    assert "conv1.weight" in stem["holds"] and "layer1.1.conv2.weight" in stem["holds"]
    assert "layer2.0.downsample.0.weight" in stem["read_by"]
    samples = np.random.default_rng(4).normal(size=(6, 1, 20, 20)).astype(np.float32)
    reset, _ = fedfuse.fuse([a, a], method="weight-matching", model="resnet18",
                            reset_bn=samples, reset_bn_batch=3)
    assert int(reset["layer4.1.bn2.num_batches_tracked"]) == 2
    assert not np.allclose(reset["bn1.running_mean"], a["bn1.running_mean"])
    np.testing.assert_allclose(reset["fc.weight"], a["fc.weight"], rtol=1e-6)


def test_pfnm_fuses_torchvision_resnet18_state_dicts_and_widens_every_group():
    """PFNM matches a residual network's permutation groups: two copies of one state dict fuse
    back to it (up to the sharp prior's shrinkage), and two unrelated ones lie side by side,
    every group (each stage's stream, each block's inner channels) twice as wide, under
    torchvision's names and in their order."""
    a = _torchvision_resnet18(np.random.default_rng(5))
    same, _ = fedfuse.fuse([a, a], method="pfnm", model="resnet18", sigma=1e-4)
    assert list(same) == list(a)
    for name, value in a.items():
        np.testing.assert_allclose(same[name], value, rtol=1e-3, atol=1e-3, err_msg=name)
    b = _torchvision_resnet18(np.random.default_rng(6))
    wide, _ = fedfuse.fuse([a, b], method="pfnm", model="resnet18", sigma=1e-4)
    assert list(wide) == list(a)
    assert wide["conv1.weight"].shape == (8, 1, 7, 7)
    assert wide["layer1.0.conv1.weight"].shape == (8, 8, 3, 3)
    assert wide["layer2.0.downsample.0.weight"].shape == (16, 8, 1, 1)
    assert wide["layer4.1.conv2.weight"].shape == (64, 64, 3, 3)
    assert wide["fc.weight"].shape == (3, 64)


def _torchvision_vit(rng, mlp=6):
    """A torchvision ``VisionTransformer(image_size=28, patch_size=7, num_layers=1,
    num_heads=2, hidden_dim=8, mlp_dim=mlp, num_classes=3)`` state dict, ``conv_proj`` on one
    channel, random values."""
    h, seq = 8, 17
    shapes = {
        "class_token": (1, 1, h), "conv_proj.weight": (h, 1, 7, 7), "conv_proj.bias": (h,),
        "encoder.pos_embedding": (1, seq, h),
    }
    block = "encoder.layers.encoder_layer_0."
    for name, shape in [
        ("ln_1.weight", (h,)), ("ln_1.bias", (h,)),
        ("self_attention.in_proj_weight", (3 * h, h)), ("self_attention.in_proj_bias", (3 * h,)),
        ("self_attention.out_proj.weight", (h, h)), ("self_attention.out_proj.bias", (h,)),
        ("ln_2.weight", (h,)), ("ln_2.bias", (h,)),
        ("mlp.0.weight", (mlp, h)), ("mlp.0.bias", (mlp,)),
        ("mlp.3.weight", (h, mlp)), ("mlp.3.bias", (h,)),
    ]:
        shapes[block + name] = shape
    shapes.update({"encoder.ln.weight": (h,), "encoder.ln.bias": (h,),
                   "heads.head.weight": (3, h), "heads.head.bias": (3,)})
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def test_pfnm_fuses_torchvision_vits_widening_only_their_mlps(tmp_path):
    """PFNM on ViT state dicts: two copies fuse back to one (up to the sharp prior's
    shrinkage); two unrelated ones keep the stream's 8 features and the 2 heads (torchvision's
    attention ties them) while the MLP holds both dicts' units side by side, under
    torchvision's names and in their order."""
    model = tmp_path / "vit.toml"
    model.write_text('[model]\nkind = "vit"\ninput = [1, 28, 28]\n[model.vit]\npatch = 7\n'
                     "hidden = 8\nlayers = 1\nheads = 2\nmlp = 6\n")
    a = _torchvision_vit(np.random.default_rng(7))
    same, _ = fedfuse.fuse([a, a], method="pfnm", model=str(model), sigma=1e-4)
    assert list(same) == list(a)
    for name, value in a.items():
        np.testing.assert_allclose(same[name], value, rtol=1e-3, atol=1e-3, err_msg=name)
    b = _torchvision_vit(np.random.default_rng(8))
    wide, report = fedfuse.fuse([a, b], method="gpi-fnm", model=str(model), sigma=1e-4,
                                eps=0.1)
    assert list(wide) == list(a)
    block = "encoder.layers.encoder_layer_0."
    assert wide[block + "self_attention.in_proj_weight"].shape == (24, 8)
    assert wide[block + "mlp.0.weight"].shape == (12, 8)
    assert wide[block + "mlp.3.weight"].shape == (8, 12)
    assert "mlp = 12" in report["metadata"]["fedfuse.model"]
