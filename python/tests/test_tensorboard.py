"""--tensorboard: TensorBoard's own reader finds every scalar of every round, with the values
results.json holds, and the resolved config as text."""

import json
import subprocess

import pytest

import fedfuse

from conftest import ROOT

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

QUICKSTART = ROOT / "examples" / "quickstart.toml"


def read(folder):
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def f32(x):
    import numpy as np
    return float(np.float32(x))


def test_every_round_s_figures_reach_tensorboard(tmp_path, fedfuse_bin):
    done = subprocess.run(
        [str(fedfuse_bin), "run", str(QUICKSTART), "--out", str(tmp_path / "run"), "--quiet",
         "--set", "rounds=4", "--set", "method.name=fedsparse",
         "--tensorboard", str(tmp_path / "tb")],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    rounds = json.loads((tmp_path / "run" / "results.json").read_text())["rounds"]
    acc = read(tmp_path / "tb")
    tags = set(acc.Tags()["scalars"])
    for tag, key in [("global/accuracy", "global_accuracy"), ("global/loss", "global_loss"),
                     ("train/loss", "train_loss"), ("traffic/bytes_up", "bytes_up"),
                     ("traffic/bytes_down", "bytes_down"), ("model/params", "global_params"),
                     ("local/accuracy_mean", "local_accuracy_mean")]:
        assert tag in tags, tag
        assert scalars(acc, tag) == [(r["round"], f32(r[key])) for r in rounds], tag
    total, want = 0, []
    for r in rounds:
        total += r["bytes_up"] + r["bytes_down"]
        want.append((r["round"], f32(total)))
    assert scalars(acc, "traffic/bytes_total") == want
    assert scalars(acc, "clients/rejected") == [(r["round"], 0.0) for r in rounds]
    # The method's own figures: FedSparse's, one tag each.
    for key in rounds[-1]["method"]:
        assert scalars(acc, f"method/{key}") == [
            (r["round"], f32(r["method"][key])) for r in rounds if key in r["method"]], key
    # The resolved config, as text.
    (config,) = acc.Tensors("config")
    text = config.tensor_proto.string_val[0].decode()
    assert 'name = "fedsparse"' in text and "rounds = 4" in text


def test_python_runs_and_compare_arms_log_too(tmp_path, fedfuse_bin):
    result = fedfuse.run(QUICKSTART, overrides=["rounds=2"], progress=False,
                         tensorboard=tmp_path / "py")
    assert scalars(read(tmp_path / "py"), "global/accuracy") == [
        (r["round"], f32(r["global_accuracy"])) for r in result.rounds]

    # `fedfuse compare`: one TensorBoard run per arm and seed.
    cfg = tmp_path / "compare.toml"
    cfg.write_text(
        'title = "tb"\n'
        'seeds = [1, 2]\n'
        '[base]\nrounds = 2\nclients = 4\n'
        '[base.dataset]\nname = "digits"\n'
        '[base.model]\nkind = "mlp"\nhidden = [16]\n'
        '[[arms]]\nlabel = "FedAvg"\nmethod = { name = "fedavg" }\n'
        '[[arms]]\nlabel = "FedProx mu=0.01"\nmethod = { name = "fedprox", mu = 0.01 }\n'
    )
    done = subprocess.run(
        [str(fedfuse_bin), "compare", str(cfg), "--out", str(tmp_path / "cmp"),
         "--tensorboard", str(tmp_path / "tb")],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    runs = sorted(str(p.parent.relative_to(tmp_path / "tb"))
                  for p in (tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert runs == ["FedAvg/seed-1", "FedAvg/seed-2", "FedProx_mu_0.01/seed-1",
                    "FedProx_mu_0.01/seed-2"]
    for run in runs:
        assert len(scalars(read(tmp_path / "tb" / run), "global/accuracy")) == 2


def test_sweep_settings_and_methods_are_runs(tmp_path, fedfuse_bin):
    smoke = ROOT / "experiments" / "digits-smoke.toml"
    done = subprocess.run(
        [str(fedfuse_bin), "sweep", str(smoke), "--out", str(tmp_path / "sweep"), "--seeds", "0",
         "--tensorboard", str(tmp_path / "tb")],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    rows = fedfuse.runs._read_csv(tmp_path / "sweep" / "results.csv")
    (setting,) = [p for p in (tmp_path / "tb").iterdir()]
    methods = sorted(p.name for p in setting.iterdir())
    assert methods == sorted({r["method"] for r in rows})
    for r in rows:
        assert scalars(read(setting / r["method"]), "accuracy") == [(r["round"], f32(r["accuracy"]))]
