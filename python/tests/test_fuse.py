"""`fedfuse.fuse` against `fedfuse fuse` on the PFNM reference fixtures, and its errors."""

import json
import subprocess

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
