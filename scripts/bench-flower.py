"""fedfuse on Flower, measured (docs/BENCHMARKS.md, "fedfuse on Flower").

    bash scripts/bench-flower.sh [--skip-deployment] [--repeats 5]   # release build of fedfuse-py

1. Server-side aggregation per round inside Flower, for 10 and 100 replies of the 784-100-10
   MLP: `fedfuse.flwr.Strategy` running FedAvg against Flower's own `FedAvg.aggregate_train`
   on the same reply messages; PFNM through Flower against the same fusion called directly.
2. End-to-end round time on loopback with 10 SuperNodes: fedfuse's strategy and ClientApp
   (the digits quickstart, FedAvg) against the same deployment running Flower's own FedAvg
   with a numpy ClientApp training the same 64-64-10 MLP as long (2 epochs, batch 16).
   A round's time is the difference between runs of 6 and 2 rounds, over 4.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path[:0] = [str(ROOT / "python" / "tests"), str(ROOT / "python" / "tests" / "apps" / "numpy_mlp")]

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

import fedfuse  # noqa: E402
from fedfuse.flwr import Strategy, to_recorddict  # noqa: E402

MNIST_RUN = """seed = 1
rounds = {rounds}
clients = {clients}
data_dir = "{data}"
[dataset]
name = "mnist"
[method]
name = "{method}"
[model]
kind = "mlp"
hidden = [100]
"""


def median_ms(xs):
    return f"{1000 * statistics.median(xs):.1f}"


def as_messages(strategy: Strategy, server_round: int):
    """The round's instructions, with message ids set as a Grid sets them when it pushes."""
    messages = list(strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), None))
    for m in messages:
        m.metadata.__dict__["_message_id"] = m.object_id
    return messages


def replies_to(messages, models, examples):
    return [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in model.items()}),
                    "metrics": MetricRecord({"num-examples": n}),
                }
            ),
            reply_to=m,
        )
        for m, model, n in zip(messages, models, examples)
    ]


def random_models(n, rng, like):
    return [{k: (v + rng.normal(0, 0.01, v.shape)).astype(np.float32) for k, v in like.items()} for _ in range(n)]


def separate_inits(n, rng):
    from numpy_mlp.client_app import init

    models = []
    for _ in range(n):
        m = init(rng, 784, 100, 10)
        models.append(m)
    return models


def aggregation(tmp: Path, repeats: int) -> None:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    rng = np.random.default_rng(0)
    print("| replies | fedfuse Strategy (FedAvg) | of which Rust folding | Flower FedAvg | ratio |")
    print("|---|---|---|---|---|")
    for n in (10, 100):
        config = tmp / f"fedavg-{n}.toml"
        config.write_text(MNIST_RUN.format(rounds=repeats, clients=n, data=SHARED / "data" / "mnist", method="fedavg"))
        strategy = Strategy(config)
        strategy.slots = {node: node - 1 for node in range(1, n + 1)}
        glob = {k: a.numpy() for k, a in to_recorddict(strategy._server.global_model())["arrays"].items()}
        models = random_models(n, rng, glob)
        examples = [int(e) for e in rng.integers(50, 500, n)]
        ours, folding, theirs = [], [], []
        flower = FedAvg()
        for r in range(1, repeats + 1):
            messages = as_messages(strategy, r)
            replies = replies_to(messages, models, examples)
            start = time.perf_counter()
            strategy.aggregate_train(r, replies)
            wall = time.perf_counter() - start
            m = strategy.rounds[-1]
            # Flower's FedAvg does not evaluate in aggregate_train; fedfuse evaluates the new
            # global model on the test set there, so that part is left out.
            ours.append(wall - m["evaluate_seconds"])
            folding.append(m["aggregate_seconds"])
            start = time.perf_counter()
            flower.aggregate_train(r, replies)
            theirs.append(time.perf_counter() - start)
        ratio = statistics.median(theirs) / statistics.median(ours)
        print(f"| {n} | {median_ms(ours)} ms | {median_ms(folding)} ms | {median_ms(theirs)} ms | {ratio:.2f}x |")

    print()
    print("| replies | PFNM through Flower (aggregate_train, less evaluation) | of which Rust | `fedfuse.fuse` on the same models |")
    print("|---|---|---|---|")
    n = 10
    config = tmp / "pfnm.toml"
    config.write_text(MNIST_RUN.format(rounds=repeats, clients=n, data=SHARED / "data" / "mnist", method="pfnm"))
    ours, rust, direct = [], [], []
    for r in range(repeats):
        # One round per Server: PFNM's later rounds send sub-models, round 1 fuses.
        strategy = Strategy(config, ["rounds=1"])
        strategy.slots = {node: node - 1 for node in range(1, n + 1)}
        models = separate_inits(n, np.random.default_rng(r))
        messages = as_messages(strategy, 1)
        replies = replies_to(messages, models, [100] * n)
        start = time.perf_counter()
        strategy.aggregate_train(1, replies)
        wall = time.perf_counter() - start
        m = strategy.rounds[-1]
        ours.append(wall - m["evaluate_seconds"])
        rust.append(m["aggregate_seconds"])
        start = time.perf_counter()
        fedfuse.fuse(models, method="pfnm", class_counts=[[10] * 10] * n, seed=1)
        direct.append(time.perf_counter() - start)
    print(f"| {n} | {median_ms(ours)} ms | {median_ms(rust)} ms | {median_ms(direct)} ms |")


def deployment_rounds(tmp: Path) -> None:
    from flower_harness import deployment
    from numpy_digits import write_partitions

    app = ROOT / "examples" / "flower"
    numpy_app = ROOT / "python" / "tests" / "apps" / "numpy_mlp"
    write_partitions(tmp / "data", 10)
    runs = {
        "fedfuse Strategy (FedAvg) + fedfuse ClientApp": lambda d, r: d.run(
            app, f'fedfuse-set="rounds={r}"'
        ),
        "Flower FedAvg + numpy ClientApp": lambda d, r: d.run(
            numpy_app,
            f'strategy="flower-fedavg" rounds={r} epochs=2 lr=0.05 batch-size=16 '
            f'data-dir="{tmp / "data"}"',
        ),
    }
    print()
    print("| deployment (10 SuperNodes, loopback) | 2 rounds | 6 rounds | per round |")
    print("|---|---|---|---|")
    with deployment(tmp / "flower", nodes=10) as d:
        for name, run in runs.items():
            wall = {}
            for r in (2, 6):
                start = time.perf_counter()
                run(d, r)
                wall[r] = time.perf_counter() - start
            print(f"| {name} | {wall[2]:.1f} s | {wall[6]:.1f} s | {(wall[6] - wall[2]) / 4:.2f} s |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-deployment", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        aggregation(Path(tmp), args.repeats)
        if not args.skip_deployment:
            deployment_rounds(Path(tmp))


if __name__ == "__main__":
    main()
