"""A ClientApp that is never run: flwr requires one in every app, and the nodes of this app are
`fedfuse flower-node`s, which train with fedfuse and load no Python. A Python SuperNode that
joins this federation by mistake replies with this error instead of training."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

app = ClientApp()

WHY = (
    "this app's nodes are `fedfuse flower-node --config examples/flower-rust-nodes/run.toml "
    "--partition-id N` (docs/FLOWER.md); a Python SuperNode has no trainer here"
)


@app.train()
def train(msg: Message, context: Context) -> Message:
    raise RuntimeError(WHY)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    raise RuntimeError(WHY)
