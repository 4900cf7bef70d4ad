"""The ClientApp: each node trains its own client slot (`partition-id`) with fedfuse."""

from pathlib import Path

from fedfuse.flwr import make_client_app

app = make_client_app(Path(__file__).with_name("run.toml"))
