"""fedfuse's Rust SuperNode (crates/flower-node, `fedfuse flower-node`) in a real Flower
deployment on 127.0.0.1: no Python on the nodes, Flower's own FedAvg or fedfuse's strategy on
the server."""

import json
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

import fedfuse._core
import numpy_digits
from conftest import ROOT
from fedfuse.flwr import to_recorddict
from flower_harness import Deployment, deployment, mint_tls, node_key

pytest.importorskip("flwr")
NUMPY_APP = ROOT / "python" / "tests" / "apps" / "numpy_mlp"
ADDER = ROOT / "target" / "debug" / "examples" / "adder"


def start_adders(d, steps):
    if not ADDER.exists():
        pytest.fail(f"{ADDER} is missing: build it with `cargo build --workspace --all-targets`")
    for i, (c, n) in enumerate(steps):
        d._spawn(f"rust{i}", [str(ADDER), "--superlink", f"127.0.0.1:{d.port}", "--add", str(c), "--examples", str(n)])
    d._wait(lambda: all("joined" in d.log(f"rust{i}") for i in range(len(steps))), 60, "the Rust nodes to join")


def assert_stepped(out, steps, rounds):
    """The stock FedAvg run in `out` moved every array by `rounds` weighted-mean steps."""
    init = dict(np.load(out / "init.npz"))
    final = dict(np.load(out / "model.npz"))
    step = sum(c * n for c, n in steps) / sum(n for _, n in steps)
    assert list(final) == list(init)
    for k in init:
        assert final[k].dtype == init[k].dtype and final[k].shape == init[k].shape, k
        np.testing.assert_allclose(final[k], init[k] + rounds * step, atol=1e-6, rtol=0, err_msg=k)
    return step


def test_rust_nodes_with_flowers_fedavg_give_the_weighted_mean_step(tmp_path):
    steps = [(0.5, 10), (-0.25, 30)]  # (c_i, n_i): node i adds c_i and reports n_i examples
    out = tmp_path / "out"
    with deployment(tmp_path / "flower", nodes=0) as d:
        start_adders(d, steps)
        d.run(NUMPY_APP, f'strategy="flower-fedavg" rounds=3 fraction-evaluate=1.0 out="{out}"')
        logs = [d.log(f"rust{i}") for i in range(len(steps))]
    step = assert_stepped(out, steps, rounds=3)
    evaluated = json.loads((out / "done.json").read_text())["evaluate"]
    assert sorted(evaluated) == ["1", "2", "3"], evaluated
    want_loss = step  # FedAvg weighs each node's loss (its c_i) by its examples
    for m in evaluated.values():
        assert m["loss"] == pytest.approx(want_loss, abs=1e-9), m
    assert all(log.count("train") >= 3 for log in logs), logs


def test_nodes_started_before_the_superlink_join_once_it_listens(tmp_path):
    # As docs/FLOWER.md's recipes do: `flower-superlink ... &` and the nodes at once, while
    # the SuperLink needs a second or two to listen.
    steps = [(1.0, 10), (0.5, 10)]
    out = tmp_path / "out"
    d = Deployment(tmp_path / "flower", nodes=0)
    try:
        for i, (c, n) in enumerate(steps):
            d._spawn(f"rust{i}", [str(ADDER), "--superlink", f"127.0.0.1:{d.port}", "--add", str(c), "--examples", str(n)])
        nodes = [f"rust{i}" for i in range(len(steps))]
        d._wait(lambda: all("no SuperLink answers" in d.log(n) for n in nodes), 30, "the nodes to try")
        d.start_superlink()
        d._wait(lambda: all("joined" in d.log(n) for n in nodes), 60, "the nodes to join")
        d.run(NUMPY_APP, f'strategy="flower-fedavg" rounds=1 out="{out}"')
        logs = [d.log(n) for n in nodes]
    finally:
        d.stop()
    assert not any("panicked" in log for log in logs), logs
    assert_stepped(out, steps, rounds=1)


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


# A layer list with batch norm (its running statistics and I64 counter travel), and the same
# under FedBN (the norms stay on the nodes, each node keeps its own across rounds).
BN_LIST = ("model={kind='sequential',layers=[{type='linear',out=32},{type='batchnorm1d'},"
           "{type='relu'},{type='linear',out=10}]")


@pytest.mark.parametrize("model", [[], [BN_LIST + "}"], [BN_LIST + ",local_norm=true}"]],
                         ids=["mlp", "layer-list", "layer-list-fedbn"])
def test_rust_fedfuse_nodes_with_a_fedfuse_strategy_equal_the_simulator(tmp_path, fedfuse_bin, model):
    sets = ["clients=3", "rounds=2", *model]
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


def test_fedfuse_nodes_under_flowers_fedavg_reach_fedfuse_runs_accuracy(tmp_path, fedfuse_bin):
    # Flower's own FedAvg (no fedfuse on the server but its test-set scoring) over 5 Rust
    # nodes on the digits quickstart, started from fedfuse's initial model: the same
    # training as `fedfuse run`, so the same accuracy on its test set.
    sets = ["clients=5", "rounds=3"]
    init = tmp_path / "init.npz"
    arrays = to_recorddict(fedfuse._core.Server(str(CONFIG), sets).global_model())["arrays"]
    np.savez(init, **{k: a.numpy() for k, a in arrays.items()})
    out = tmp_path / "out"
    with deployment(tmp_path / "flower", nodes=0) as d:
        start_rust_nodes(d, fedfuse_bin, range(5), sets)
        d.run(
            NUMPY_APP,
            f'strategy="flower-fedavg" rounds=3 init="{init}" evaluate-config="{CONFIG}" '
            f'fedfuse-set="{";".join(sets)}" out="{out}"',
        )
    sim = tmp_path / "sim"
    cmd = [str(fedfuse_bin), "run", str(CONFIG), "--out", str(sim), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True)
    want = json.loads((sim / "results.json").read_text())["rounds"][-1]["global_accuracy"]
    got = json.loads((out / "done.json").read_text())["central"]["3"]["accuracy"]
    assert abs(got - want) <= 0.01, (got, want)
    assert want > 0.7, want  # 3 rounds of the quickstart: about 0.77; untrained: about 0.1
    # Flower folds replies in arrival order, fedfuse in slot order: equal up to float32
    # rounding, which two further rounds of training amplify (CI once saw 8.6e-5). A
    # run on another seed differs by 0.25 or more in every tensor.
    model, sim_model = dict(np.load(out / "model.npz")), load_file(str(sim / "model.safetensors"))
    for k in sim_model:
        np.testing.assert_allclose(model[k], sim_model[k], atol=1e-3, rtol=0, err_msg=k)


def test_node_authentication_and_tls(tmp_path, fedfuse_bin):
    tls = mint_tls(tmp_path / "tls")
    key, stranger = node_key(tmp_path / "sn0"), node_key(tmp_path / "stranger")
    sets = ["clients=1", "rounds=1"]
    out = tmp_path / "out"
    with deployment(tmp_path / "flower", nodes=0, tls=tls, auth=True) as d:
        node_id = d.register(key.with_suffix(".pub"))
        node = [str(fedfuse_bin), "flower-node", "--superlink", f"127.0.0.1:{d.port}",
                "--config", str(CONFIG), "--partition-id", "0"]
        for s in sets:
            node += ["--set", s]

        def refused(*args):
            done = subprocess.run(node + list(args), capture_output=True, text=True, timeout=120)
            assert done.returncode != 0, done.stderr
            assert "panicked" not in done.stderr, done.stderr
            return done.stderr

        err = refused("--root-certificates", str(tls["ca"]), "--auth-key", str(stranger))
        assert "refused this node's key" in err and "flwr supernode register" in err, err
        err = refused("--root-certificates", str(tls["ca"]))
        assert "authenticates its nodes" in err and "--auth-key" in err, err
        err = refused("--root-certificates", str(tls["other_ca"]), "--auth-key", str(key))
        assert "certificate" in err and "--root-certificates" in err, err
        err = refused("--insecure", "--auth-key", str(key))
        assert "TLS" in err or "plain HTTP" in err, err

        # The node trains on its own samples (a CSV only it holds), not a partition.
        own = tmp_path / "own.csv"
        (x, y), _ = numpy_digits.load()
        np.savetxt(own, np.column_stack([x[:300], y[:300]]), delimiter=",", fmt="%.6g",
                   header=",".join([f"p{i}" for i in range(64)] + ["label"]), comments="")
        d._spawn("rust0", node + ["--root-certificates", str(tls["ca"]), "--auth-key", str(key),
                                  "--own-data", str(own)])
        d._wait(lambda: f"as node {node_id}" in d.log("rust0"), 60, "the registered node to join")
        d.run(APP, f'fedfuse-set="{";".join(sets)}" out="{out}"')
        log = d.log("rust0")
    assert f"240 training examples from its own data in {own}" in log, log
    results = json.loads((out / "results.json").read_text())["rounds"]
    assert [r["rejected"] for r in results] == [[]]
    assert results[0]["global_accuracy"] > 0.5, results  # one node, 240 samples, one round


def test_nodes_rejoin_a_restarted_superlink(tmp_path):
    steps = [(1.0, 5), (0.5, 15)]  # two: Flower's FedAvg trains on at least two nodes
    out = tmp_path / "out"
    with deployment(tmp_path / "flower", nodes=0) as d:
        start_adders(d, steps)
        doomed = d.submit(NUMPY_APP, 'strategy="flower-fedavg" rounds=100')
        nodes = [f"rust{i}" for i in range(len(steps))]
        trained = "train answered"
        d._wait(lambda: all(trained in d.log(n) for n in nodes), 120, "the nodes to train once")
        d.kill("superlink")  # mid-run: the run's later rounds never come
        doomed.kill()
        doomed.wait()
        d._wait(lambda: all("lost the SuperLink" in d.log(n) for n in nodes), 60, "the nodes to notice")
        d.start_superlink()  # a fresh SuperLink on the same port has forgotten every node
        d._wait(lambda: all("rejoined as node" in d.log(n) for n in nodes), 120, "the nodes to rejoin")
        d.run(NUMPY_APP, f'strategy="flower-fedavg" rounds=1 out="{out}"')
        alive = [d.procs[n].poll() is None for n in nodes]
        logs = [d.log(n) for n in nodes]
    assert all(alive), logs
    assert not any("panicked" in log for log in logs), logs
    assert_stepped(out, steps, rounds=1)


def test_a_failing_step_reaches_the_server_as_flowers_error_and_the_node_goes_on(tmp_path, fedfuse_bin):
    # The server's model (hidden 32) is not the nodes' (hidden 64): every local step fails.
    sets = ["clients=2"]
    out = tmp_path / "out"
    with deployment(tmp_path / "flower", nodes=0) as d:
        start_rust_nodes(d, fedfuse_bin, range(2), sets)
        done = d.run(NUMPY_APP, f'strategy="flower-fedavg" rounds=2 hidden=32 out="{out}"')
        alive = [d.procs[f"rust{i}"].poll() is None for i in range(2)]
        logs = [d.log(f"rust{i}") for i in range(2)]
    assert all(alive), logs
    assert all(log.count("train failed: client") == 2 for log in logs), logs
    # Flower's FedAvg counts both replies as failures in both rounds and aggregates nothing.
    assert (done.stdout + done.stderr).count("Received 0 results and 2 failures") == 2, done.stdout[-3000:]
    assert np.load(out / "model.npz").files == []
