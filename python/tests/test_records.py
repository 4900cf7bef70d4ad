"""Record <-> Flower RecordDict: dense and sparse, bit for bit, through Flower's own objects; and
a client's state between rounds (FedBN's norms) as the Flower arrays a ClientApp stores."""

import numpy as np
import pytest

from conftest import ROOT
from fedfuse import _core, arrays_from_tensors, tensors_from_arrays

flwr = pytest.importorskip("flwr")
from fedfuse.flwr import from_recorddict, to_recorddict  # noqa: E402


def model(rng):
    w = rng.standard_normal((16, 8)).astype(np.float32)
    w[rng.random((16, 8)) < 0.9] = 0.0  # mostly zero: travels sparse
    w[0, 0] = -0.0
    return {"layers.0.weight": w, "layers.0.bias": rng.standard_normal(16).astype(np.float32)}


@pytest.mark.parametrize("sparse", [False, True])
def test_round_trip_through_a_recorddict_is_bit_exact(sparse):
    m = model(np.random.default_rng(0))
    config = [("server_round", 3), ("proximal_mu", 0.01), ("flag", True), ("note", "x")]
    content = _core.record_to_flower(tensors_from_arrays(m), config, [("train_loss", 0.5)], 123, sparse)
    rd = to_recorddict(content)
    arrays = rd["arrays"]
    assert list(arrays) == list(m)  # PyTorch names, in order
    stypes = [a.stype for a in arrays.values()]
    assert stypes == (["fedfuse.sparse.v1", "numpy.ndarray"] if sparse else ["numpy.ndarray"] * 2)
    # Dense arrays are what Flower itself makes from numpy.
    np.testing.assert_array_equal(arrays["layers.0.bias"].numpy(), m["layers.0.bias"])
    assert rd["config"]["server-round"] == 3 and rd["config"]["proximal-mu"] == 0.01
    assert rd["metrics"]["num-examples"] == 123
    tensors, back_config, metrics, n, was_sparse = _core.record_from_flower(from_recorddict(rd))
    back = arrays_from_tensors(tensors)
    for k in m:
        assert back[k].tobytes() == m[k].tobytes(), k
    assert dict(back_config) == dict(config)
    assert dict(metrics) == {"train_loss": 0.5} and n == 123 and was_sparse == sparse
    if sparse:
        dense = _core.record_to_flower(tensors_from_arrays(m), config, [], 123, False)
        size = lambda c: sum(len(a[4]) for a in c[0])  # noqa: E731
        assert size(content) < size(dense) / 2


def test_a_stock_numpy_reply_is_read():
    m = model(np.random.default_rng(1))
    rd = flwr.app.RecordDict({
        "arrays": flwr.app.ArrayRecord({k: flwr.app.Array(v) for k, v in m.items()}),
        "metrics": flwr.app.MetricRecord({"num-examples": 40, "loss": 0.25}),
    })
    tensors, config, metrics, n, sparse = _core.record_from_flower(from_recorddict(rd))
    assert n == 40 and dict(metrics) == {"loss": 0.25} and not sparse and config == []
    assert arrays_from_tensors(tensors)["layers.0.weight"].tobytes() == m["layers.0.weight"].tobytes()


def test_foreign_arrays_are_refused_with_their_name():
    rd = flwr.app.RecordDict({
        "arrays": flwr.app.ArrayRecord({"w": flwr.app.Array(np.zeros(3, np.float64))}),
        "metrics": flwr.app.MetricRecord({"num-examples": 1}),
    })
    with pytest.raises(_core.FedfuseError, match="`w`.*float64"):
        _core.record_from_flower(from_recorddict(rd))


# A layer list with batch norm (tensors `1.*`) under FedBN, on the Flower quickstart's config.
FEDBN = ["clients=3", "model={kind='sequential',layers=[{type='linear',out=32},{type='batchnorm1d'},"
         "{type='relu'},{type='linear',out=10}],local_norm=true}"]
QUICKSTART = str(ROOT / "examples" / "flower" / "fedfuse_quickstart" / "run.toml")
NORMS = ["1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"]


def test_a_fedbn_client_keeps_its_norms_only_in_the_state_it_is_given_and_returns():
    server = _core.Server(QUICKSTART, FEDBN)
    server.start_round()
    instruction = server.instruct(0)
    assert not any(a[0] in NORMS for a in instruction[0])  # the server sends none
    client = _core.Client(QUICKSTART, 0, FEDBN)
    reply, state = client.fit(instruction)
    assert not any(a[0] in NORMS for a in reply[0])  # nor does the client
    assert [a[0] for a in state] == NORMS
    # The object keeps nothing between calls (Flower may start a new process each round):
    # the same step without a state gives the same reply, from the kept state another one.
    again, _ = client.fit(instruction)
    assert [a[4] for a in again[0]] == [a[4] for a in reply[0]]
    later, _ = client.fit(instruction, state)
    assert [a[4] for a in later[0]] != [a[4] for a in reply[0]]
    assert client.evaluate(reply, state) != client.evaluate(reply)

    # A state that is not this model's norms is refused, naming the tensor and the way out.
    record = flwr.app.ArrayRecord({k: flwr.app.Array(t, tuple(s), st, bytes(d)) for k, t, s, st, d in state})
    record["1.weight"] = flwr.app.Array(np.ones(16, np.float32))
    wrong = [(k, a.dtype, list(a.shape), a.stype, a.data) for k, a in record.items()]
    with pytest.raises(_core.FedfuseError, match=r"(?s)`1\.weight` has shape \[16\].*start a new run"):
        client.fit(instruction, wrong)
    with pytest.raises(_core.FedfuseError, match="1.bias"):
        client.fit(instruction, [a for a in wrong if a[0] != "1.bias"])
    # A method that keeps nothing on its clients returns no state and takes none.
    plain = _core.Client(QUICKSTART, 0, ["clients=3"])
    server = _core.Server(QUICKSTART, ["clients=3"])
    server.start_round()
    _, none = plain.fit(server.instruct(0))
    assert none is None
    with pytest.raises(_core.FedfuseError, match="keeps no state on its clients"):
        plain.fit(server.instruct(0), state)
