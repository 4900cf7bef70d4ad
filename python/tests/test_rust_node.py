"""fedfuse's Rust SuperNode (crates/flower-node, `fedfuse flower-node`) in a real Flower
deployment on 127.0.0.1: no Python on the nodes, Flower's own FedAvg or fedfuse's strategy on
the server."""

import json
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import ROOT
from flower_harness import deployment

pytest.importorskip("flwr")
NUMPY_APP = ROOT / "python" / "tests" / "apps" / "numpy_mlp"
ADDER = ROOT / "target" / "debug" / "examples" / "adder"


def test_rust_nodes_with_flowers_fedavg_give_the_weighted_mean_step(tmp_path):
    if not ADDER.exists():
        pytest.fail(f"{ADDER} is missing: build it with `cargo build --workspace --all-targets`")
    steps = [(0.5, 10), (-0.25, 30)]  # (c_i, n_i): node i adds c_i and reports n_i examples
    out = tmp_path / "out"
    with deployment(tmp_path / "flower", nodes=0) as d:
        for i, (c, n) in enumerate(steps):
            d._spawn(f"rust{i}", [str(ADDER), "--superlink", f"127.0.0.1:{d.port}", "--add", str(c), "--examples", str(n)])
        d._wait(lambda: all("joined" in d.log(f"rust{i}") for i in range(len(steps))), 60, "the Rust nodes to join")
        d.run(NUMPY_APP, f'strategy="flower-fedavg" rounds=3 fraction-evaluate=1.0 out="{out}"')
        logs = [d.log(f"rust{i}") for i in range(len(steps))]
    init = dict(np.load(out / "init.npz"))
    final = dict(np.load(out / "model.npz"))
    step = sum(c * n for c, n in steps) / sum(n for _, n in steps)
    assert list(final) == list(init)
    for k in init:
        assert final[k].dtype == init[k].dtype and final[k].shape == init[k].shape, k
        np.testing.assert_allclose(final[k], init[k] + 3 * step, atol=1e-6, rtol=0, err_msg=k)
    evaluated = json.loads((out / "done.json").read_text())["evaluate"]
    assert sorted(evaluated) == ["1", "2", "3"], evaluated
    want_loss = step  # FedAvg weighs each node's loss (its c_i) by its examples
    for m in evaluated.values():
        assert m["loss"] == pytest.approx(want_loss, abs=1e-9), m
    assert all(log.count("train") >= 3 for log in logs), logs


APP = ROOT / "examples" / "flower"
CONFIG = APP / "fedfuse_quickstart" / "run.toml"


def start_rust_nodes(d, fedfuse_bin, slots, sets):
    for i in slots:
        args = [str(fedfuse_bin), "flower-node", "--insecure", "--superlink", f"127.0.0.1:{d.port}",
                "--config", str(CONFIG), "--partition-id", str(i)]
        for s in sets:
            args += ["--set", s]
        d._spawn(f"rust{i}", args)
    d._wait(lambda: all("joined" in d.log(f"rust{i}") for i in slots), 60, "the Rust nodes to join")


def assert_equals_simulator(tmp_path, fedfuse_bin, out, sets, rounds):
    sim = tmp_path / "sim"
    cmd = [str(fedfuse_bin), "run", str(CONFIG), "--out", str(sim), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True)
    got, want = load_file(str(out / "model.safetensors")), load_file(str(sim / "model.safetensors"))
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=1e-6, rtol=0, err_msg=k)
    results = json.loads((out / "results.json").read_text())["rounds"]
    assert [r["rejected"] for r in results] == [[]] * rounds


def test_rust_fedfuse_nodes_with_a_fedfuse_strategy_equal_the_simulator(tmp_path, fedfuse_bin):
    sets = ["clients=3", "rounds=2"]
    out = tmp_path / "out"
    with deployment(tmp_path / "flower", nodes=0) as d:
        start_rust_nodes(d, fedfuse_bin, range(3), sets)
        d.run(APP, f'fedfuse-set="{";".join(sets)}" out="{out}"')
    assert_equals_simulator(tmp_path, fedfuse_bin, out, sets, rounds=2)


def test_a_mixed_federation_of_rust_and_python_nodes_equals_the_simulator(tmp_path, fedfuse_bin):
    # Slots 0 and 1: Flower's own SuperNodes running the fedfuse ClientApp (Python); slots 2
    # and 3: `fedfuse flower-node`.
    sets = ["clients=4", "rounds=2"]
    out = tmp_path / "out"
    with deployment(tmp_path / "flower", nodes=2) as d:
        start_rust_nodes(d, fedfuse_bin, range(2, 4), sets)
        d.run(APP, f'fedfuse-set="{";".join(sets)}" out="{out}"')
    assert_equals_simulator(tmp_path, fedfuse_bin, out, sets, rounds=2)
