"""fedfuse.flwr.Strategy without a deployment: replies made here, as a Grid would deliver them."""

import numpy as np
import pytest

pytest.importorskip("flwr")
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from conftest import ROOT  # noqa: E402
from fedfuse import FedfuseError  # noqa: E402
from fedfuse.flwr import Strategy, to_recorddict  # noqa: E402

CONFIG = ROOT / "examples" / "flower" / "fedfuse_quickstart" / "run.toml"


def one_round(strategy, examples, shift, replace=None):
    """Round 1 with three replies: slot i sends the global model + shift[i] and examples[i],
    or the RecordDict `replace[i]`."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    strategy.slots = {node: node - 1 for node in range(1, 4)}
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
    for m in messages:
        m.metadata.__dict__["_message_id"] = m.object_id
    model = {k: a.numpy() for k, a in to_recorddict(strategy._server.global_model())["arrays"].items()}
    replies = [
        Message(
            RecordDict({
                "arrays": ArrayRecord({k: Array(v + np.float32(d)) for k, v in model.items()}),
                "metrics": MetricRecord({"num-examples": n}),
            }),
            reply_to=m,
        )
        for m, n, d in zip(messages, examples, shift)
    ]
    for slot, content in (replace or {}).items():
        replies[slot] = Message(content, reply_to=messages[slot])
    arrays, _ = strategy.aggregate_train(1, replies)
    return model, {k: a.numpy() for k, a in arrays.items()}, strategy.rounds[-1]


def test_a_reply_claiming_more_than_max_examples_is_rejected_not_weighted():
    sets = ["clients=3", "rounds=1"]
    # Slot 2 claims a weight that would swamp the others.
    model, fused, metrics = one_round(Strategy(CONFIG, sets, max_examples=1000), [10, 30, 10**12], [1.0, 2.0, -50.0])
    assert [r["client"] for r in metrics["rejected"]] == [2]
    reason = metrics["rejected"][0]["reason"]
    assert "1000000000000 examples" in reason and "max_examples = 1000" in reason, reason
    for k in model:  # (10 * 1 + 30 * 2) / 40 = 1.75
        np.testing.assert_allclose(fused[k], model[k] + 1.75, atol=1e-5, err_msg=k)
    # Without a bound given, the run's largest partition bounds the claims: no honest slot
    # holds more, and 2^63 - 1 examples would otherwise take the whole mean.
    model, fused, metrics = one_round(Strategy(CONFIG, sets), [10, 30, 2**63 - 1], [1.0, 2.0, -50.0])
    assert [r["client"] for r in metrics["rejected"]] == [2]
    assert "replies.max_examples" in metrics["rejected"][0]["reason"], metrics["rejected"]
    for k in model:
        np.testing.assert_allclose(fused[k], model[k] + 1.75, atol=1e-5, err_msg=k)


def test_weightless_and_unreadable_replies_are_rejected_and_the_round_goes_on():
    sets = ["clients=3", "rounds=1"]
    # Every reply claims 0 examples: no weight anywhere, so the round keeps the global model.
    model, fused, metrics = one_round(Strategy(CONFIG, sets), [0, 0, 0], [1.0, 2.0, 3.0])
    assert [r["client"] for r in metrics["rejected"]] == [0, 1, 2]
    assert all("0 examples" in r["reason"] for r in metrics["rejected"]), metrics["rejected"]
    for k in model:
        np.testing.assert_array_equal(fused[k], model[k], err_msg=k)
    # Slot 1's array declares a negative shape: that reply is left out, the others fold.
    broken = RecordDict({
        "arrays": ArrayRecord({"layers.0.weight": Array(dtype="float32", shape=(-1,), stype="numpy.ndarray", data=b"")}),
        "metrics": MetricRecord({"num-examples": 10}),
    })
    model, fused, metrics = one_round(Strategy(CONFIG, sets), [10, 10, 30], [1.0, 2.0, 3.0], {1: broken})
    assert [r["client"] for r in metrics["rejected"]] == [1], metrics["rejected"]
    for k in model:  # (10 * 1 + 30 * 3) / 40 = 2.5
        np.testing.assert_allclose(fused[k], model[k] + 2.5, atol=1e-5, err_msg=k)


def test_max_examples_must_be_positive():
    with pytest.raises(FedfuseError, match="max_examples"):
        Strategy(CONFIG, ["clients=3"], max_examples=0)


def test_a_nodes_error_text_is_shortened_and_escaped():
    from flwr.app import Error

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    strategy = Strategy(CONFIG, ["clients=3", "rounds=1"])
    strategy.slots = {node: node - 1 for node in range(1, 4)}
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
    for m in messages:
        m.metadata.__dict__["_message_id"] = m.object_id
    # A 1 MB reason with a terminal escape and newlines, as a hostile node could send.
    hostile = "\x1b[2J" + "line\n" * 200_000
    replies = [Message(Error(code=2, reason=hostile), reply_to=m) for m in messages]
    strategy.aggregate_train(1, replies)
    reasons = [r["reason"] for r in strategy.rounds[-1]["rejected"]]
    assert len(reasons) == 3, reasons
    for reason in reasons:
        assert len(reason) < 1000 and "\x1b" not in reason and "\n" not in reason, reason[:200]


def test_a_torchvision_resnet_travels_under_torchvisions_names():
    # What a stock PyTorch ClientApp on torchvision.models.resnet18 loads and sends back: the
    # strategy's arrays and its fused model carry torchvision's state_dict names.
    from conftest import SHARED

    sets = [
        "clients=3",
        "rounds=1",
        "dataset.name=mnist",
        f"data_dir={str(SHARED / 'data' / 'mnist')!r}",
        "dataset.train_samples=90",
        "dataset.test_samples=20",
        'model={kind="resnet18", width=2, norm="group"}',
    ]
    model, fused, metrics = one_round(Strategy(CONFIG, sets), [5, 15, 5], [1.0, 2.0, 3.0])
    assert metrics["rejected"] == [], metrics["rejected"]
    for key in ["conv1.weight", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight", "fc.bias"]:
        assert key in model and key in fused, (key, sorted(model)[:8])
    assert not any(k[0].isdigit() for k in fused), sorted(fused)[:8]
    for k in model:  # (5 * 1 + 15 * 2 + 5 * 3) / 25 = 2
        np.testing.assert_allclose(fused[k], model[k] + 2.0, atol=1e-4, err_msg=k)
