"""The ServerApp: fedfuse's strategy for the method of the run config."""

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedfuse.flwr import Strategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = str(context.run_config.get("fedfuse-config") or Path(__file__).with_name("run.toml"))
    overrides = [o for o in str(context.run_config.get("fedfuse-set", "")).split(";") if o]
    out = str(context.run_config.get("out", "")) or None
    Strategy(config, overrides, out=out).start(grid)
