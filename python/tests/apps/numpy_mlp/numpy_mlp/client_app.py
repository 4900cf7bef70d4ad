"""A stock Flower ClientApp in numpy: a one-hidden-layer ReLU MLP trained with minibatch SGD.

It speaks only Flower's stock contract: the global model arrives as the "arrays" ArrayRecord
(none in a round that lets clients start from their own initialisation) and the reply holds
one ArrayRecord with PyTorch names (``layers.0.weight`` is ``[out, in]``) and a MetricRecord
with ``num-examples`` (and
``class_count.<k>``, which fedfuse's neuron matching reads when a client sends it).
"""

import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


def init(rng, d_in, hidden, classes):
    def layer(fan_in, fan_out):
        bound = 1.0 / np.sqrt(fan_in)
        w = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        b = rng.uniform(-bound, bound, fan_out).astype(np.float32)
        return w, b

    w0, b0 = layer(d_in, hidden)
    w1, b1 = layer(hidden, classes)
    return {"layers.0.weight": w0, "layers.0.bias": b0, "layers.1.weight": w1, "layers.1.bias": b1}


def forward(m, x):
    h = np.maximum(x @ m["layers.0.weight"].T + m["layers.0.bias"], 0.0)
    return h, h @ m["layers.1.weight"].T + m["layers.1.bias"]


def accuracy(m, x, y):
    return float((forward(m, x)[1].argmax(1) == y).mean())


def train(m, x, y, epochs, lr, batch, rng):
    m = {k: v.astype(np.float32).copy() for k, v in m.items()}
    classes = m["layers.1.bias"].shape[0]
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            xb, yb = x[idx], y[idx]
            h, logits = forward(m, xb)
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            g = (p - np.eye(classes, dtype=np.float32)[yb]) / len(idx)
            gh = (g @ m["layers.1.weight"]) * (h > 0)
            m["layers.1.weight"] -= lr * (g.T @ h)
            m["layers.1.bias"] -= lr * g.sum(0)
            m["layers.0.weight"] -= lr * (gh.T @ xb)
            m["layers.0.bias"] -= lr * gh.sum(0)
    return m


@app.train()
def fit(msg: Message, context: Context) -> Message:
    cfg = context.run_config
    pid = int(context.node_config["partition-id"])
    if not cfg["data-dir"]:
        raise ValueError(
            "data-dir is empty: give the folder of part-<partition-id>.npz files "
            "(python/tests/numpy_digits.py write_partitions makes them)"
        )
    data = np.load(Path(str(cfg["data-dir"])) / f"part-{pid}.npz")
    x, y = data["x"].astype(np.float32), data["y"].astype(np.int64)
    server_round = int(msg.content["config"]["server-round"]) if "config" in msg.content else 1
    rng = np.random.default_rng([int(cfg["seed"]), pid, server_round])
    given = {k: a.numpy() for rec in msg.content.array_records.values() for k, a in rec.items()}
    if given:
        start = given
    else:
        start = init(rng, x.shape[1], int(cfg["hidden"]), 10)
    save = str(cfg["save-dir"])
    if pid == int(cfg["stall-partition"]):
        (Path(save) / f"stalled-{pid}").write_text("training")
        time.sleep(3600)
    model = train(start, x, y, int(cfg["epochs"]), float(cfg["lr"]), int(cfg["batch-size"]), rng)
    if save:
        np.savez(Path(save) / f"local-{pid}-round-{server_round}.npz", **model)
    # Neuron matching weighs output units by each client's class counts (optional metrics).
    class_counts = {f"class_count.{c}": int(n) for c, n in enumerate(np.bincount(y, minlength=10))}
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in model.items()}),
            "metrics": MetricRecord({"num-examples": len(x), **class_counts}),
        }
    )
    return Message(content, reply_to=msg)
