"""The UCI digits split for the numpy ClientApp (apps/numpy_mlp), in numpy alone: a fixed
train/test split and label-skewed (Dirichlet) partitions written as part-<id>.npz."""

import gzip
from pathlib import Path

import numpy as np

from conftest import SHARED


def load():
    with gzip.open(SHARED / "data" / "uci-small" / "digits.csv.gz", "rt") as f:
        raw = np.loadtxt(f, delimiter=",")
    x, y = (raw[:, :-1] / 16.0).astype(np.float32), raw[:, -1].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    test = order[: len(x) // 5]
    train = order[len(x) // 5 :]
    return (x[train], y[train]), (x[test], y[test])


def write_partitions(folder: Path, parts: int, alpha: float = 0.5, seed: int = 3):
    """Writes part-<i>.npz for `parts` nodes; returns the test split `(x, y)`."""
    (x, y), test = load()
    rng = np.random.default_rng(seed)
    owner = np.empty(len(y), dtype=np.int64)
    for c in range(10):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        shares = rng.dirichlet(np.full(parts, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
        for i, chunk in enumerate(np.split(idx, cuts)):
            owner[chunk] = i
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(parts):
        mine = np.flatnonzero(owner == i)
        np.savez(folder / f"part-{i}.npz", x=x[mine], y=y[mine])
    return test
