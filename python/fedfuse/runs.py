"""Federations from Python: :func:`run` runs a config as ``fedfuse run`` does and returns its
results as Python values, :func:`compare` a ``fedfuse compare`` file; :func:`evaluate` scores a
model as a run's server does."""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedfuse._core import compare as _compare
from fedfuse._core import evaluate as _evaluate
from fedfuse._core import run as _run
from fedfuse._core import sweep as _sweep

# What a progress callback gets: ``(kind, a, b)`` and, for ``"note"``, the line.
ProgressFn = Callable[..., None]

# Columns of a round that are no scalars: they stay out of the data frame's plain columns.
_NESTED = ("method", "rejected", "client_accuracies")


class Rounds(list):
    """Per-round metrics, one dict per round as results.json lists them (``round``,
    ``global_accuracy``, ``global_loss``, ``bytes_up``, ``bytes_down``, ``rejected``, the
    method's own figures under ``method``, ...; a figure not measured is ``None``)."""

    def to_pandas(self):
        """The rounds as a pandas DataFrame indexed by round: every scalar figure a column,
        ``rejected`` the count of rejected replies, each of the method's figures a column of
        its own name (as in metrics.csv). Needs pandas; nothing else here does."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                "Rounds.to_pandas needs pandas (pip install pandas); without it the rounds "
                "are plain dicts"
            ) from e
        rows = []
        for r in self:
            row = {k: (np.nan if v is None else v) for k, v in r.items() if k not in _NESTED}
            row["rejected"] = len(r.get("rejected") or [])
            for k, v in (r.get("method") or {}).items():
                row[k] = np.nan if v is None else v
            rows.append(row)
        return pd.DataFrame(rows).set_index("round")


@dataclass(frozen=True)
class RunResult:
    """What a run gives back: what results.json holds, and the final model."""

    config: dict
    """The resolved config (every default filled in), as results.json writes it."""
    rounds: Rounds
    """Per-round metrics (:class:`Rounds`; ``rounds.to_pandas()`` for a DataFrame)."""
    final: dict
    """The final figures: ``global_accuracy``, ``global_loss``, ``bytes_total``, ..."""
    model: dict[str, np.ndarray]
    """The final global model as the run saves it: a ``state_dict`` of numpy arrays under the
    file's names (torchvision's for its ResNets), float32, ``num_batches_tracked`` int64."""
    out: Path | None
    """The run folder, when ``out`` was given."""


def run(
    config: str | os.PathLike,
    *,
    overrides: Sequence[str] = (),
    data_dir: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    resume: bool = False,
    progress: bool | ProgressFn = True,
    tensorboard: str | os.PathLike | None = None,
) -> RunResult:
    """Runs the federation of the config file ``config``, as ``fedfuse run CONFIG`` does: the
    same checks, the same results bit for bit. ``overrides`` are ``--set`` strings
    (``["rounds=5", "method.name=fedprox"]``) and ``data_dir`` is ``--data-dir``.

    With ``out`` the run writes its folder there, as ``--out`` does (config.toml,
    results.json, metrics.csv, the model, the plots), with a checkpoint beside it after every
    round; ``resume=True`` continues from that checkpoint. Without ``out`` nothing is written.

    ``progress=True`` shows a bar on stderr (tqdm's, in a terminal or a notebook, when tqdm is
    installed; otherwise a bar of the round's clients on a terminal, a line per round
    elsewhere); ``False`` shows nothing; a callable is
    called as ``progress(kind, a, b)``: ``("start", rounds, 0)``, ``("round", round,
    clients)``, ``("client", round, 0)``, ``("end", round, global_accuracy)``, and
    ``("note", 0, 0, line)``.

    ``tensorboard`` is ``--tensorboard``: a folder (created) for TensorBoard event files, every
    round's figures as scalars (``global/accuracy``, ``traffic/bytes_total``,
    ``method/...``) and the resolved config as text.

    Rust does the work with the GIL released. Ctrl-C stops the run after the round in
    progress and raises ``KeyboardInterrupt``; with ``out``, the checkpoint of the rounds done
    is left, and ``resume=True`` finishes the run with the results an uninterrupted one has.
    An exception raised by a ``progress`` callable stops it the same way.
    """
    callback = _callback(progress)
    try:
        results, tensors = _run(
            os.fspath(config),
            [str(o) for o in overrides],
            None if data_dir is None else os.fspath(data_dir),
            None if out is None else os.fspath(out),
            bool(resume),
            callback,
            None if tensorboard is None else os.fspath(tensorboard),
        )
    finally:
        if isinstance(callback, _Bar):
            callback.close()
    model = {}
    for name, shape, data in tensors:
        value = np.frombuffer(data, dtype="<f4").reshape(shape).copy()
        if name.rsplit(".", 1)[-1] == "num_batches_tracked":
            value = np.rint(value).astype(np.int64)
        model[name] = value
    return RunResult(
        config=results["config"],
        rounds=Rounds(results["rounds"]),
        final=results["final"],
        model=model,
        out=None if out is None else Path(out),
    )


class Table(list):
    """Rows of a CSV file `fedfuse compare` writes, one dict per row (numbers as floats or
    ints, an empty cell as ``None``)."""

    def to_pandas(self):
        """The rows as a pandas DataFrame (needs pandas)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("Table.to_pandas needs pandas (pip install pandas)") from e
        return pd.DataFrame(list(self))


def _cell(text: str) -> Any:
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _read_csv(path: Path) -> Table:
    with open(path, newline="") as f:
        return Table({k: _cell(v) for k, v in row.items()} for row in csv.DictReader(f))


@dataclass(frozen=True)
class CompareResult:
    """What a comparison gives back: its folder and its tables."""

    out: Path
    """The folder: results.csv, summary.csv, summary.md, the plots, runs.toml."""
    results: Table
    """results.csv: one row per arm, seed and round."""
    summary: Table
    """summary.csv: one row per arm, means and spreads over the seeds."""


def compare(
    config: str | os.PathLike,
    out: str | os.PathLike,
    *,
    data_dir: str | os.PathLike | None = None,
    seeds: Sequence[int] | None = None,
    resume: bool = False,
    progress: bool | ProgressFn = True,
    tensorboard: str | os.PathLike | None = None,
) -> CompareResult:
    """Runs the ``fedfuse compare`` file ``config`` (every arm for every seed) into ``out``, as
    ``fedfuse compare CONFIG --out OUT`` does; ``seeds`` is ``--seeds``, ``tensorboard`` is
    ``--tensorboard`` (one TensorBoard run per arm and seed). ``progress`` as for :func:`run`.
    Ctrl-C stops the run in progress after its round and raises ``KeyboardInterrupt``; the runs
    already finished stay in ``out``, and ``resume=True`` takes them from there.

    Returns the folder and its tables (``results``, ``summary``; ``.to_pandas()`` with pandas).
    """
    return _experiment(_compare, config, out, data_dir, seeds, resume, progress, tensorboard)


def sweep(
    config: str | os.PathLike,
    out: str | os.PathLike,
    *,
    data_dir: str | os.PathLike | None = None,
    seeds: Sequence[int] | None = None,
    resume: bool = False,
    progress: bool | ProgressFn = True,
    tensorboard: str | os.PathLike | None = None,
) -> CompareResult:
    """Runs the ``fedfuse sweep`` file ``config`` (one-shot fusion over seeds, client counts,
    widths and partitions) into ``out``, as ``fedfuse sweep CONFIG --out OUT`` does. Ctrl-C
    ends it before its next setting and raises ``KeyboardInterrupt``; ``resume=True`` takes the
    finished settings from ``out``. ``tensorboard`` is ``--tensorboard`` (a TensorBoard run per
    setting and method). Returns the folder and its tables (results.csv, one row per setting
    and method; summary.csv)."""
    return _experiment(_sweep, config, out, data_dir, seeds, resume, progress, tensorboard)


def _experiment(command, config, out, data_dir, seeds, resume, progress,
                tensorboard) -> CompareResult:
    """Runs an experiment command of the core into ``out`` and reads its tables back."""
    callback = _callback(progress)
    try:
        command(
            os.fspath(config),
            os.fspath(out),
            None if data_dir is None else os.fspath(data_dir),
            None if seeds is None else [int(s) for s in seeds],
            bool(resume),
            callback,
            None if tensorboard is None else os.fspath(tensorboard),
        )
    finally:
        if isinstance(callback, _Bar):
            callback.close()
    folder = Path(out)
    return CompareResult(out=folder, results=_read_csv(folder / "results.csv"),
                         summary=_read_csv(folder / "summary.csv"))


def _callback(progress: bool | ProgressFn | None) -> ProgressFn | None:
    if progress is True:
        return _Bar()
    if progress is False or progress is None:
        return None
    return progress


def evaluate(
    model: Mapping[str, Any],
    config: str | os.PathLike | Mapping[str, Any],
    *,
    dataset: str | None = None,
    overrides: Sequence[str] = (),
    data_dir: str | os.PathLike | None = None,
    split: str = "test",
) -> dict:
    """Scores ``model`` (a ``state_dict``: numpy arrays or torch tensors, in any order) as the
    server of a ``fedfuse run CONFIG`` run scores its global model: cross-entropy and
    accuracy on the run's test set (``split="test"``) or on its validation split
    (``split="validation"``, which needs ``dataset.validation_fraction``). The data are the
    config's (``overrides`` and ``data_dir`` as for :func:`run`), so the same config scores
    the model a run saved as its results.json reports. Tensor names are the run's file names
    (torchvision's for its ResNets) or the layer list's (``0.weight``); shapes must fit the
    config's model.

    ``config`` may also be a ``[model]`` table as a mapping (``{"kind": "resnet18", "width":
    8}``) with ``dataset`` naming the data (``"mnist"``): the model is then scored on that
    dataset's test set, as a run of that model with default settings would score it.

    Returns ``{"accuracy", "loss", "samples", "split"}``.
    """
    import json
    from fedfuse import tensors_from_arrays

    if split not in ("test", "validation"):
        raise ValueError(f'split must be "test" or "validation", not {split!r}')
    section = isinstance(config, Mapping)
    if section != (dataset is not None):
        raise ValueError("give a config file, or a [model] mapping with dataset=")
    loss, accuracy, samples = _evaluate(
        None if section else os.fspath(config),
        json.dumps(dict(config)) if section else None,
        dataset,
        [str(o) for o in overrides] + [f"dataset.score={split}"],
        None if data_dir is None else os.fspath(data_dir),
        tensors_from_arrays(model),
    )
    return {"accuracy": accuracy, "loss": loss, "samples": samples, "split": split}


class _Bar:
    """The default progress display: tqdm's bar over rounds when tqdm is installed (it picks
    the notebook widget in Jupyter); else, on a terminal, a bar of the round's clients redrawn
    in place, and elsewhere (a notebook, a log) one line per round, on stderr."""

    WIDTH = 24

    def __init__(self) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            tqdm = None
        self._tqdm = tqdm
        self._bar = None
        self._tty = sys.stderr.isatty()
        self._rounds = 0
        self._clients = (0, 0)

    def __call__(self, kind: str, a: Any, b: Any, line: str | None = None) -> None:
        if kind == "start":
            self.close()
            self._rounds = a
            if self._tqdm is not None:
                self._bar = self._tqdm(total=a, unit="round", desc="fedfuse")
        elif kind == "round":
            self._clients = (0, b)
            self._draw(a)
        elif kind == "client":
            done, total = self._clients
            self._clients = (done + 1, total)
            self._draw(a)
        elif kind == "end":
            if self._bar is not None:
                self._bar.update(1)
                self._bar.set_postfix(accuracy=f"{b:.4f}")
            else:
                end = "\r\033[K" if self._tty else ""
                print(f"{end}round {a}/{self._rounds}: global accuracy {b:.4f}", file=sys.stderr,
                      flush=True)
        elif kind == "note" and line:
            if self._bar is not None:
                self._bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)

    def _draw(self, round_: int) -> None:
        if self._bar is not None or not self._tty:
            return
        done, total = self._clients
        filled = self.WIDTH * done // max(total, 1)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        print(f"\rround {round_}/{self._rounds} [{bar}] {done}/{total} clients", end="",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
