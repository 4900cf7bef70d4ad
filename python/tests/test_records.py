"""Record <-> Flower RecordDict: dense and sparse, bit for bit, through Flower's own objects."""

import numpy as np
import pytest

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
