"""fedfuse on a real Flower deployment (SuperLink and SuperNodes on 127.0.0.1): the same final
model as `fedfuse run` with the same config and seed."""

import json
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import ROOT
from flower_harness import deployment

pytest.importorskip("flwr")
APP = ROOT / "examples" / "flower"
CONFIG = APP / "fedfuse_quickstart" / "run.toml"


def simulate(fedfuse_bin, out, sets):
    args = [str(fedfuse_bin), "run", str(CONFIG), "--out", str(out), "--quiet"]
    for s in sets:
        args += ["--set", s]
    subprocess.run(args, check=True, capture_output=True)
    return load_file(str(out / "model.safetensors")), json.loads((out / "results.json").read_text())


def test_fedavg_over_flower_equals_the_simulator(tmp_path, fedfuse_bin):
    sets = ["rounds=5"]
    with deployment(tmp_path / "flower", nodes=10) as d:
        out = tmp_path / "over-flower"
        done = d.run(APP, f'fedfuse-set="{";".join(sets)}" out="{out}"')
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    want, want_results = simulate(fedfuse_bin, tmp_path / "sim", sets)
    got = load_file(str(out / "model.safetensors"))
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=1e-6, rtol=0, err_msg=k)
    results = json.loads((out / "results.json").read_text())
    assert len(results["rounds"]) == 5
    for a, b in zip(results["rounds"], want_results["rounds"]):
        assert a["rejected"] == []
        assert abs(a["global_accuracy"] - b["global_accuracy"]) < 1e-9
        assert a["clients"] == b["clients"] == 10
