"""fedfuse's Rust SuperNode (crates/flower-node) in a real Flower deployment on 127.0.0.1,
with Flower's own FedAvg on the server and no Python on the nodes."""

import json

import numpy as np
import pytest

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
