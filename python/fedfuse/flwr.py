"""fedfuse on Flower: every fedfuse method as a Flower strategy, and a ClientApp that trains
with fedfuse.

Server side::

    from flwr.serverapp import ServerApp
    from fedfuse.flwr import Strategy

    app = ServerApp()

    @app.main()
    def main(grid, context):
        strategy = Strategy("run.toml", out="runs/flower")   # any `fedfuse run` config
        strategy.start(grid)

Client side: ``make_client_app("run.toml")`` gives a ClientApp that trains the node's client slot
(its node config's ``partition-id``) with fedfuse; ``fedfuse.flwr.client_app`` reads the config's
path from the run config key ``fedfuse-config``.

A node's client slot is its ``partition-id``: the strategy asks every node for it before the
first round (a ``query`` message), so client seeds, weights and the order in which replies are
folded are those of ``fedfuse run``. Nodes that do not answer the query (a stock ClientApp) take
the slots left over, in node-id order. A failed or missing reply is listed in results.json's
``rejected``, not fatal.

Records: the global model travels as the ``"arrays"`` ArrayRecord (PyTorch names, numpy
``.npy`` arrays, or fedfuse sparse blobs with ``stype = "fedfuse.sparse.v1"``), settings as
the ``"config"`` ConfigRecord (``server-round``, ``proximal-mu``), and a reply's figures as the
``"metrics"`` MetricRecord (``num-examples``): the stock strategy contract.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.serverapp.strategy import Strategy as FlowerStrategy

from fedfuse import FedfuseError, _core

__all__ = [
    "Strategy",
    "PFNM",
    "GPIFNM",
    "FedSparse",
    "GEMS",
    "FedMix",
    "FedNGM",
    "client_app",
    "make_client_app",
    "evaluate_fn",
    "to_recorddict",
    "from_recorddict",
]

log = logging.getLogger("fedfuse")


def _shown(text: str, limit: int = 300) -> str:
    """Text a node sent, fit for a log line and results.json: at most `limit` characters, with
    control characters (newlines, terminal escapes) escaped, since a reply's reason can be
    megabytes of anything."""
    text = str(text)
    kept = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:limit])
    return kept if len(text) <= limit else f"{kept}... ({len(text)} characters in all)"

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
PARTITION_ID = "partition-id"
CONFIG_KEY = "fedfuse-config"
# The ArrayRecord in a node's Context.state holding what its client keeps between rounds
# (FedBN's own norm tensors under `model.local_norm`).
CLIENT_STATE = "fedfuse.client-state"


def _array_record(arrays) -> ArrayRecord:
    """fedfuse's Flower arrays (``(key, dtype, shape, stype, data)``) as an ArrayRecord."""
    return ArrayRecord(
        {
            key: Array(dtype, tuple(int(d) for d in shape), stype, bytes(data))
            for key, dtype, shape, stype, data in arrays
        }
    )


def _arrays(record: ArrayRecord) -> list:
    """An ArrayRecord's arrays as fedfuse reads them."""
    return [(key, a.dtype, list(a.shape), a.stype, a.data) for key, a in record.items()]


def to_recorddict(content, *, metrics: bool = True) -> RecordDict:
    """Flower content from fedfuse (``(arrays, config, metrics)``) as a RecordDict."""
    arrays, config, metric_items = content
    records: dict[str, Any] = {ARRAYS: _array_record(arrays)}
    records[CONFIG] = ConfigRecord(dict(config))
    if metrics:
        records[METRICS] = MetricRecord(dict(metric_items))
    return RecordDict(records)


def from_recorddict(rd: RecordDict):
    """A RecordDict as fedfuse's Flower content. It must hold at most one record of each kind
    (a stock reply holds one ArrayRecord and one MetricRecord)."""
    for kind, records in (
        ("ArrayRecord", rd.array_records),
        ("ConfigRecord", rd.config_records),
        ("MetricRecord", rd.metric_records),
    ):
        if len(records) > 1:
            raise FedfuseError(f"the message holds {len(records)} {kind}s; fedfuse reads one")
    arrays = [a for record in rd.array_records.values() for a in _arrays(record)]
    config = [(k, v) for rec in rd.config_records.values() for k, v in rec.items()]
    metrics = [(k, v) for rec in rd.metric_records.values() for k, v in rec.items()]
    for key, value in config:
        if not isinstance(value, (bool, int, float, str)):
            raise FedfuseError(f"config `{key}`: {type(value).__name__} values are not fedfuse settings")
    for key, value in metrics:
        if isinstance(value, list):
            raise FedfuseError(f"metric `{key}`: a list; fedfuse reads scalar metrics")
    return arrays, config, metrics


class Strategy(FlowerStrategy):
    """Any fedfuse method as a Flower strategy.

    ``config`` is a ``fedfuse run`` TOML file (its ``[method]`` table picks the method;
    ``[dataset]`` and ``[model]`` give the server's test set and the initial model),
    ``overrides`` are ``key=value`` strings as ``fedfuse run --set`` takes. The server's side
    of each round (instructions, aggregation, evaluation on the test set) runs in Rust, exactly
    as in ``fedfuse run``. With ``out``, the run's results.json, metrics.csv, model and plots
    are written there after the last round. ``max_examples`` bounds the ``num-examples`` a
    reply may claim (its FedAvg weight, which a node could otherwise inflate at will): a reply
    above it is listed in ``rejected`` with the reason. It takes the place of the config's
    ``replies.max_examples``, whose default is the run's largest partition (give it for nodes
    training on more data of their own); the config's ``replies.max_update_norm`` applies as
    in ``fedfuse run``.
    """

    def __init__(
        self,
        config: str | os.PathLike,
        overrides: Iterable[str] = (),
        out: str | os.PathLike | None = None,
        min_nodes: int | None = None,
        node_wait: float = 600.0,
        max_examples: int | None = None,
    ) -> None:
        self.config = str(config)
        self.overrides = [str(o) for o in overrides]
        self.out = None if out is None else str(out)
        if self.out is not None:
            _core.check_output_folder(self.out)  # refuse now, not after the last round
        if max_examples is not None and (isinstance(max_examples, bool) or int(max_examples) < 1):
            raise FedfuseError(f"max_examples = {max_examples!r}: give a positive number of examples, or None")
        self._server = _core.Server(self.config, self.overrides, None if max_examples is None else int(max_examples))
        self.num_clients = self._server.num_clients()
        self.min_nodes = self.num_clients if min_nodes is None else int(min_nodes)
        self.node_wait = float(node_wait)
        self.slots: dict[int, int] = {}  # node id -> client slot
        self.rounds: list[dict] = []
        # The open round: slots that failed before a message went out, and the messages sent.
        self._pending: dict[int, str] = {}
        self._messages: list[tuple[int, Message]] = []

    # -- the Strategy API ------------------------------------------------------------------

    def summary(self) -> None:
        log.info("fedfuse strategy: %s", self._server.summary())

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if not self.slots:
            self._assign_slots(grid)
        by_slot = {slot: node for node, slot in self.slots.items()}
        sampled = self._server.start_round()
        self._pending = {}
        messages = []
        for slot in sampled:
            if slot not in by_slot:
                self._pending[slot] = f"no node holds client slot {slot}"
                continue
            content = self._server.instruct(slot)
            rd = to_recorddict(content, metrics=False)
            for key, value in config.items():
                rd[CONFIG][key] = value
            msg = Message(rd, dst_node_id=by_slot[slot], message_type="train", group_id=str(server_round))
            messages.append((slot, msg))
        self._messages = messages
        return [m for _, m in messages]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        slot_of = {m.metadata.message_id: slot for slot, m in self._messages}
        outcome: dict[int, Any] = dict(self._pending)
        for reply in replies:
            slot = slot_of.get(reply.metadata.reply_to_message_id)
            if slot is None:
                continue
            if reply.has_error():
                outcome[slot] = f"Flower error {reply.error.code}: {_shown(reply.error.reason)}"
                continue
            try:
                arrays, config, metrics = from_recorddict(reply.content)
                config = [(k, v) for k, v in config if k != PARTITION_ID]
                outcome[slot] = (arrays, config, metrics)
            except FedfuseError as e:
                outcome[slot] = str(e)
        metrics = self._server.finish_round(list(outcome.items()))
        self.rounds.append(metrics)
        arrays = to_recorddict(self._server.global_model(), metrics=False)[ARRAYS]
        numeric = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and v == v and k != "round"
        }
        numeric.update({f"method.{k}": float(v) for k, v in metrics.get("method", {}).items() if v == v})
        numeric["rejected"] = float(len(metrics["rejected"]))
        for r in metrics["rejected"]:
            log.warning("round %d: client %d left out: %s", server_round, r["client"], _shown(r["reason"]))
        return arrays, MetricRecord(numeric)

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        # The server evaluates the global model on its test set after each round, as
        # `fedfuse run` does; nodes are not asked.
        return []

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        return None

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn=None,
    ) -> Result:
        """Runs the federation: ``num_rounds`` defaults to the config's ``rounds``, and the
        initial model is the config's (``initial_arrays`` must be ``None``: fedfuse draws it
        from the run's seed, so that the run matches ``fedfuse run``). One-shot methods stop
        after their last stage."""
        if initial_arrays is not None:
            raise FedfuseError(
                "fedfuse.flwr.Strategy draws the initial model from the run config's seed; "
                "leave initial_arrays out"
            )
        rounds = self._server.num_rounds() if num_rounds is None else int(num_rounds)
        self.summary()
        result = Result()
        arrays = to_recorddict(self._server.global_model(), metrics=False)[ARRAYS]
        train_config = ConfigRecord() if train_config is None else train_config
        for server_round in range(1, rounds + 1):
            messages = self.configure_train(server_round, arrays, train_config, grid)
            replies = grid.send_and_receive(messages=messages, timeout=timeout)
            new_arrays, metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                arrays = new_arrays
                result.arrays = new_arrays
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
                result.evaluate_metrics_serverapp[server_round] = MetricRecord(
                    {
                        k: v
                        for k, v in metrics.items()
                        if k in ("global_accuracy", "global_loss")
                    }
                )
            if self._server.finished():
                break
        if self.out is not None:
            self._server.write_outputs(self.out)
            log.info("fedfuse results in %s", self.out)
        return result

    # -- client slots ----------------------------------------------------------------------

    def _assign_slots(self, grid: Grid) -> None:
        """Waits for ``min_nodes`` nodes, asks each its ``partition-id`` and gives the nodes
        that do not say one the free slots in node-id order."""
        deadline = time.monotonic() + self.node_wait
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= self.min_nodes:
                break
            if time.monotonic() > deadline:
                raise FedfuseError(
                    f"{len(nodes)} of {self.min_nodes} nodes connected after {self.node_wait:.0f} s"
                )
            time.sleep(1.0)
        queries = [
            Message(RecordDict({CONFIG: ConfigRecord({})}), dst_node_id=n, message_type="query")
            for n in nodes
        ]
        node_of = {}
        replies = list(grid.send_and_receive(messages=queries, timeout=120))
        ids = {q.metadata.message_id: n for q, n in zip(queries, nodes)}
        for reply in replies:
            node = ids.get(reply.metadata.reply_to_message_id)
            if node is None or reply.has_error():
                continue
            for rec in reply.content.config_records.values():
                pid = rec.get(PARTITION_ID)
                if isinstance(pid, int) and 0 <= pid < self.num_clients and pid not in node_of.values():
                    node_of[node] = pid
        free = [s for s in range(self.num_clients) if s not in node_of.values()]
        for node in nodes:
            if node not in node_of and free:
                node_of[node] = free.pop(0)
        self.slots = node_of
        log.info("fedfuse client slots by node: %s", node_of)


def evaluate_fn(config: str | os.PathLike, overrides: Iterable[str] = ()):
    """Central evaluation for Flower's own strategies: ``FedAvg().start(...,
    evaluate_fn=evaluate_fn("run.toml"))`` scores each round's arrays on the test set of a
    ``fedfuse run`` config (the set ``fedfuse run`` scores its global model on), so a stock
    strategy's accuracy is comparable with fedfuse's. The arrays must have the config's model
    layout (PyTorch names, float32)."""
    server = _core.Server(str(config), [str(o) for o in overrides])

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        loss, accuracy = server.evaluate(from_recorddict(RecordDict({ARRAYS: arrays})))
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    return evaluate


def _method_strategy(name: str):
    def make(config, overrides: Iterable[str] = (), **kwargs) -> Strategy:
        return Strategy(config, [f"method.name={name}", *overrides], **kwargs)

    make.__name__ = name
    make.__doc__ = (
        f"A :class:`Strategy` running fedfuse's `{name}` (the config's other `[method]` keys "
        "apply; `overrides` as for `Strategy`)."
    )
    return make


PFNM = _method_strategy("pfnm")
GPIFNM = _method_strategy("gpi-fnm")
FedSparse = _method_strategy("fedsparse")
GEMS = _method_strategy("gems")
FedMix = _method_strategy("fedmix")
FedNGM = _method_strategy("fedngm")


# -- the ClientApp ---------------------------------------------------------------------------


def make_client_app(config: str | os.PathLike | None = None, overrides: Iterable[str] = ()) -> ClientApp:
    """A Flower ClientApp that trains with fedfuse.

    Its run config is the path in the Flower run config's ``fedfuse-config`` when set, else
    ``config``; ``overrides`` (or the run config's ``fedfuse-set``, ``;``-separated) change it
    as ``fedfuse run --set`` does. The node's client slot is its node config's
    ``partition-id``. Each process builds its client once (data loaded and split as in
    ``fedfuse run``; only its own slot is used). What the client keeps from one round to the
    next (under ``model.local_norm``, FedBN, its own normalisation tensors) lives in the node's
    ``Context.state`` as the ArrayRecord ``"fedfuse.client-state"``, which Flower keeps for the
    run however many ClientApp processes it starts; it never leaves the node.
    """
    app = ClientApp()
    fixed = None if config is None else str(config)
    fixed_overrides = [str(o) for o in overrides]
    clients: dict[tuple, Any] = {}

    def client(context: Context):
        path = context.run_config.get(CONFIG_KEY) or fixed
        if not path:
            raise FedfuseError(f"set `{CONFIG_KEY}` in [tool.flwr.app.config] to a fedfuse run config")
        pid = context.node_config.get(PARTITION_ID)
        if not isinstance(pid, int):
            raise FedfuseError(f"the node config has no integer `{PARTITION_ID}`")
        sets = fixed_overrides or [o for o in str(context.run_config.get("fedfuse-set", "")).split(";") if o]
        key = (str(path), pid, tuple(sets))
        if key not in clients:
            clients[key] = _core.Client(str(path), pid, sets)
        return clients[key], pid

    def stored_state(context: Context):
        record = context.state.get(CLIENT_STATE)
        if record is None:
            return None  # the client has not trained yet (or keeps nothing)
        if not isinstance(record, ArrayRecord):
            raise FedfuseError(
                f"the node's Context.state holds a {type(record).__name__} under `{CLIENT_STATE}`, "
                "where fedfuse keeps its client's state as an ArrayRecord: leave that key to fedfuse"
            )
        return _arrays(record)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        fedfuse_client, pid = client(context)
        reply, kept = fedfuse_client.fit(from_recorddict(msg.content), stored_state(context))
        # Written only after a step that succeeded: a failed one leaves the last state.
        if kept is None:
            context.state.pop(CLIENT_STATE, None)
        else:
            context.state[CLIENT_STATE] = _array_record(kept)
        rd = to_recorddict(reply)
        rd[CONFIG][PARTITION_ID] = pid
        return Message(rd, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        fedfuse_client, pid = client(context)
        # The client's own state: under model.local_norm it scores the model with its norms.
        loss, accuracy, n = fedfuse_client.evaluate(from_recorddict(msg.content), stored_state(context))
        # The same keys from every node, whatever its data (Flower's strategies require it).
        metrics = {"num-examples": n, "loss": loss, "accuracy": accuracy}
        return Message(
            RecordDict({METRICS: MetricRecord(metrics), CONFIG: ConfigRecord({PARTITION_ID: pid})}),
            reply_to=msg,
        )

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        pid = context.node_config.get(PARTITION_ID)
        return Message(RecordDict({CONFIG: ConfigRecord({PARTITION_ID: pid})}), reply_to=msg)

    return app


client_app = make_client_app()
