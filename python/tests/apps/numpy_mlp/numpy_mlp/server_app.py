"""The ServerApp: a fedfuse strategy (any method, from a fedfuse run config) or Flower's own
FedAvg, over the numpy ClientApp."""

import json
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from numpy_mlp.client_app import init

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rounds = int(cfg["rounds"])
    timeout = float(cfg["round-timeout"])
    out = str(cfg["out"]) or None
    if cfg["strategy"] == "fedfuse":
        try:
            from fedfuse.flwr import Strategy
        except ModuleNotFoundError as e:
            # `flwr run` exits 0 whatever the ServerApp raises: say the fix in its log.
            raise RuntimeError(
                'strategy = "fedfuse" needs the fedfuse package where the ServerApp runs '
                '(pip install ./python); strategy = "flower-fedavg" needs only flwr and numpy'
            ) from e

        config = str(cfg["fedfuse-config"]) or str(Path(__file__).with_name("pfnm.toml"))
        overrides = [o for o in str(cfg["fedfuse-set"]).split(";") if o]
        Strategy(config, [f"rounds={rounds}", *overrides], out=out).start(
            grid, timeout=timeout
        )
    elif cfg["strategy"] == "flower-fedavg":
        nodes = len(list(grid.get_node_ids()))
        if cfg["init"]:
            model = dict(np.load(str(cfg["init"])))
        else:
            model = init(np.random.default_rng(int(cfg["seed"])), 64, int(cfg["hidden"]), 10)
        central = None
        if cfg["evaluate-config"]:
            from fedfuse.flwr import evaluate_fn

            central = evaluate_fn(str(cfg["evaluate-config"]), [o for o in str(cfg["fedfuse-set"]).split(";") if o])
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            np.savez(Path(out) / "init.npz", **model)
        strategy = FedAvg(
            fraction_train=1.0,
            fraction_evaluate=float(cfg["fraction-evaluate"]),
            min_available_nodes=nodes,
        )
        result = strategy.start(
            grid,
            initial_arrays=ArrayRecord({k: Array(v) for k, v in model.items()}),
            num_rounds=rounds,
            timeout=timeout,
            train_config=ConfigRecord({}),
            evaluate_fn=central,
        )
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            np.savez(Path(out) / "model.npz", **{k: a.numpy() for k, a in result.arrays.items()})
            evaluated = {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
            central = {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}
            (Path(out) / "done.json").write_text(
                json.dumps({"rounds": rounds, "evaluate": evaluated, "central": central})
            )
    else:
        raise ValueError(f"strategy = {cfg['strategy']!r}: use \"fedfuse\" or \"flower-fedavg\"")
