"""fedfuse: federated learning that fuses client networks.

The Rust core does the work; this package converts numpy arrays and Flower records.

- :func:`fuse` fuses pre-trained networks (PyTorch ``state_dict``s as numpy arrays: MLPs, or
  CNNs given their ``model``) with PFNM, GPI-FNM, weight matching or FedAvg, exactly as
  ``fedfuse fuse`` does with files.
- :func:`run` runs a federation from a config file, as ``fedfuse run`` does (:func:`compare`
  a ``fedfuse compare`` file), and returns its
  metrics (``rounds.to_pandas()`` with pandas) and final model; :func:`evaluate` scores a
  model on a run config's test or validation set.
- :mod:`fedfuse.flwr` has the fedfuse methods as Flower strategies and a ClientApp that trains
  with fedfuse (needs ``flwr``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import os

import numpy as np

from fedfuse._core import FedfuseError
from fedfuse._core import fuse as _fuse
from fedfuse._core import pfnm_defaults as _pfnm_defaults
from fedfuse._core import rdp_epsilon as _rdp_epsilon
from fedfuse.runs import (
    CompareResult,
    Rounds,
    RunResult,
    Table,
    compare,
    evaluate,
    run,
    sweep,
)

__all__ = [
    "CompareResult",
    "FedfuseError",
    "Rounds",
    "RunResult",
    "Table",
    "compare",
    "evaluate",
    "fuse",
    "run",
    "sweep",
    "rdp_epsilon",
    "tensors_from_arrays",
    "arrays_from_tensors",
]
__version__ = "0.1.0"


def tensors_from_arrays(model: Mapping[str, Any], what: str = "model") -> list:
    """``(name, shape, float32 bytes)`` per array of ``model``, in its key order."""
    out = []
    for name, value in model.items():
        arr = _as_numpy(value)
        # Batch norm's ``num_batches_tracked`` is an int64 count; fedfuse holds it as a float.
        if arr.dtype.kind in "iu" and _is_counter(str(name)):
            arr = arr.astype(np.float64)
        if arr.dtype.kind != "f":
            raise FedfuseError(f"{what}, `{name}`: dtype {arr.dtype}; fedfuse fuses float arrays")
        # Not `ascontiguousarray`, which makes a 0-d array (a counter) 1-d.
        arr = np.asarray(arr, dtype="<f4", order="C")
        out.append((str(name), list(arr.shape), arr.tobytes()))
    return out


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor: through numpy, on the CPU
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _is_counter(name: str) -> bool:
    return name.rsplit(".", 1)[-1] == "num_batches_tracked"


def arrays_from_tensors(tensors: Sequence) -> dict[str, np.ndarray]:
    """The inverse of :func:`tensors_from_arrays`: a dict of float32 numpy arrays."""
    return {
        name: np.frombuffer(data, dtype="<f4").reshape(shape).copy()
        for name, shape, data in tensors
    }


# PFNM's defaults live in the Rust core, read once here.
_PFNM = _pfnm_defaults()


def fuse(
    models: Sequence[Mapping[str, Any]],
    method: str = "pfnm",
    class_counts: Sequence[Sequence[float]] | None = None,
    sigma: float = _PFNM["sigma"],
    sigma0: float = _PFNM["sigma0"],
    gamma: float = _PFNM["gamma"],
    iters: int = _PFNM["iters"],
    eps: float = _PFNM["eps"],
    max_global: int = _PFNM["max_global"],
    bias_mean: float = _PFNM["bias_mean"],
    order: str | None = None,
    seed: int = 0,
    model: str | os.PathLike | None = None,
    reset_bn: Any | None = None,
    reset_bn_batch: int = 64,
) -> tuple[dict[str, np.ndarray], dict]:
    """Fuses pre-trained networks into one global model.

    ``models`` are mappings of names to arrays (``{k: v.numpy() for k, v in
    net.state_dict().items()}``). Without ``model`` they are chains of ``nn.Linear`` layers
    with biases, under any PyTorch naming: ``nn.Sequential`` (``0.weight``, ``2.weight``),
    named (``fc1.weight``), nested (``net.0.weight``, ``classifier.weight``); the layer order
    is the mapping's, or the one its widths chain in. ``model`` names the network otherwise
    (Conv2d, BatchNorm, Linear and the flatten between): ``"lenet5"``, ``"cnn-leaf"``,
    ``"vgg9"``, ``"resnet20"``, torchvision's ``"resnet18"``, ``"resnet34"`` and
    ``"resnet50"`` (read by torchvision's tensor names), or the path of a TOML file with a
    ``[model]`` table as in a run config
    (``kind = "sequential"``, ``layers = [...]``) plus ``input``, the shape of one sample;
    each model's tensors are read as that layer list in the mapping's order, with its own
    widths, and matched over channels from the input side up.

    ``method`` is ``"pfnm"``, ``"gpi-fnm"`` (needs ``eps > 0``), ``"weight-matching"`` (Git
    Re-Basin's; fixed widths) or ``"fedavg"``. ``sigma`` and ``sigma0`` are variances, as in
    the PFNM reference code; ``class_counts`` (one list of per-class example counts per model)
    weight the output layer, and weight averages by each model's total. ``order`` is how an
    MLP of two or more hidden layers is matched: ``"top_down"`` (the default, the reference
    code's) or ``"bottom_up"`` (each layer on its full fan-in; on deep MNIST networks far closer
    to the clients' ensemble, see docs/EXPERIMENTS.md); with ``model`` it is always bottom-up.
    ``seed`` seeds PFNM's refinement orders and weight matching's layer orders.
    ``reset_bn``, an array of inputs (``[n, c, h, w]`` or ``[n, d]``, the model's), re-estimates
    every batch norm's running statistics of the fused model on it, ``reset_bn_batch`` samples
    per training-mode pass, averaged over the passes (PyTorch's ``momentum=None``): merged
    networks need it, since averaged statistics describe none of the models merged.

    Returns the fused arrays (under the first model's names; ``num_batches_tracked`` as int64
    where the first model had it as an integer) and the report: for each hidden layer, which
    global unit each client unit joined (what ``fedfuse fuse`` writes to
    ``FUSED.assignments.json``), the widths, the fused layer list (``model``), and
    ``metadata``, the header ``fedfuse fuse`` writes (``safetensors.numpy.save_file(fused,
    path, metadata=report["metadata"])`` gives its file). The result equals ``fedfuse fuse``
    on the same models, bit for bit.
    """
    tensors = [tensors_from_arrays(m, f"model {j}") for j, m in enumerate(models)]
    counts = None if class_counts is None else [[float(c) for c in row] for row in class_counts]
    fused, report = _fuse(
        tensors,
        method,
        counts,
        float(sigma),
        float(sigma0),
        float(gamma),
        int(iters),
        float(eps),
        int(max_global),
        float(bias_mean),
        None if order is None else str(order),
        int(seed),
        None if model is None else os.fspath(model),
        None if reset_bn is None else _samples(reset_bn, int(reset_bn_batch)),
    )
    arrays = arrays_from_tensors(fused)
    first = models[0] if models else {}
    for name, value in arrays.items():
        if _is_counter(name) and name in first and _as_numpy(first[name]).dtype.kind in "iu":
            arrays[name] = np.rint(value).astype(np.int64)
    return arrays, report


def _samples(values: Any, batch: int) -> tuple[list[int], bytes, int]:
    """``(shape, little-endian float32 bytes, batch)`` of an array of inputs."""
    arr = np.ascontiguousarray(_as_numpy(values), dtype="<f4")
    return list(arr.shape), arr.tobytes(), batch


def rdp_epsilon(q: float, noise_multiplier: float, steps: int, delta: float) -> tuple[float, float]:
    """Privacy spent by ``steps`` releases of the Gaussian mechanism with ``noise_multiplier``
    on a Poisson sample of rate ``q`` (``q = 1``: every client, no amplification), by RDP
    accounting on ``dp-accounting``'s default orders.

    Returns ``(epsilon, order)``: the tightest epsilon at ``delta`` and the Renyi order that
    gave it. The same accountant reports ``dp_epsilon`` in a run with ``[privacy]``.
    """
    return _rdp_epsilon(float(q), float(noise_multiplier), int(steps), float(delta))
