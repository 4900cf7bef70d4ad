"""The ServerApp: Flower's own FedAvg (the Message API) over `fedfuse flower-node`s, with flwr
and numpy only. It starts from an MLP drawn here with the names and shapes fedfuse gives the
nodes' model (`layers.{i}.weight` as `[out, in]`, `layers.{i}.bias`), since a node trains the
arrays it is sent under its run config's layout, and reports the nodes' aggregated `evaluate`
metrics (accuracy on each node's own test split, weighted by its examples) every round."""

import json
import time
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


def initial_mlp(features: int, hidden: list[int], classes: int, seed: int) -> dict[str, np.ndarray]:
    """PyTorch's (and fedfuse's) default initialisation of `nn.Linear` layers: weights and
    biases uniform in +-1/sqrt(fan_in), float32."""
    rng = np.random.default_rng(seed)
    widths = [features, *hidden, classes]
    model = {}
    for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        bound = 1.0 / np.sqrt(fan_in)
        model[f"layers.{i}.weight"] = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        model[f"layers.{i}.bias"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    return model


def wait_for_nodes(grid: Grid, wanted: int, seconds: float) -> None:
    """Flower's FedAvg waits for its `min_available_nodes` forever: a node that failed to start
    would hang the run without a word, so give up after `seconds` and say why."""
    deadline = time.monotonic() + seconds
    while (connected := len(list(grid.get_node_ids()))) < wanted:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{connected} of {wanted} nodes (min-nodes) connected after {seconds:.0f} s: "
                "start one `fedfuse flower-node` per client slot and read their output "
                "(a node whose config it refuses ends at once), or raise node-wait"
            )
        time.sleep(1.0)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    hidden = [int(w) for w in str(cfg["hidden"]).split(",") if w.strip()]
    model = initial_mlp(int(cfg["features"]), hidden, int(cfg["classes"]), int(cfg["seed"]))
    min_nodes = int(cfg["min-nodes"])
    wait_for_nodes(grid, min_nodes, float(cfg["node-wait"]))
    strategy = FedAvg(
        fraction_train=float(cfg["fraction-train"]),
        fraction_evaluate=float(cfg["fraction-evaluate"]),
        # Flower's defaults (2) would stall a federation of one node.
        min_train_nodes=1,
        min_evaluate_nodes=1,
        min_available_nodes=min_nodes,
    )
    result = strategy.start(
        grid,
        initial_arrays=ArrayRecord({k: Array(v) for k, v in model.items()}),
        num_rounds=int(cfg["num-rounds"]),
        timeout=float(cfg["round-timeout"]),
    )
    evaluated = {int(r): dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
    # Through Flower's logger, so that `flwr run --stream` shows it.
    log(INFO, "round  accuracy  loss    (the nodes' evaluate replies, weighted by examples)")
    for r, m in sorted(evaluated.items()):
        log(INFO, "%5d  %8.4f  %.4f", r, m.get("accuracy", float("nan")), m.get("loss", float("nan")))
    out = str(cfg["out"])
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        np.savez(Path(out) / "model.npz", **{k: a.numpy() for k, a in result.arrays.items()})
        trained = {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}
        (Path(out) / "metrics.json").write_text(
            json.dumps({"evaluate": evaluated, "train": trained}, indent=1, sort_keys=True) + "\n"
        )
