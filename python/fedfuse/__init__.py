"""fedfuse: federated learning that fuses client networks.

The Rust core does the work; this package converts numpy arrays and Flower records.

- :func:`fuse` fuses pre-trained MLPs (PyTorch ``state_dict``s as numpy arrays) with PFNM,
  GPI-FNM or FedAvg, exactly as ``fedfuse fuse`` does with files.
- :mod:`fedfuse.flwr` has the fedfuse methods as Flower strategies and a ClientApp that trains
  with fedfuse (needs ``flwr``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedfuse._core import FedfuseError
from fedfuse._core import fuse as _fuse
from fedfuse._core import pfnm_defaults as _pfnm_defaults
from fedfuse._core import rdp_epsilon as _rdp_epsilon

__all__ = [
    "FedfuseError",
    "fuse",
    "rdp_epsilon",
    "tensors_from_arrays",
    "arrays_from_tensors",
]
__version__ = "0.1.0"


def tensors_from_arrays(model: Mapping[str, Any], what: str = "model") -> list:
    """``(name, shape, float32 bytes)`` per array of ``model``, in its key order."""
    out = []
    for name, value in model.items():
        if hasattr(value, "detach"):  # a torch tensor: through numpy, on the CPU
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
        if arr.dtype.kind != "f":
            raise FedfuseError(f"{what}, `{name}`: dtype {arr.dtype}; fedfuse fuses float arrays")
        arr = np.ascontiguousarray(arr, dtype="<f4")
        out.append((str(name), list(arr.shape), arr.tobytes()))
    return out


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
    order: str = _PFNM["order"],
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict]:
    """Fuses pre-trained MLPs into one global model.

    ``models`` are mappings of names to arrays (``{k: v.numpy() for k, v in
    net.state_dict().items()}`` of a chain of ``nn.Linear`` layers with biases, under any
    PyTorch naming: ``nn.Sequential`` (``0.weight``, ``2.weight``), named (``fc1.weight``),
    nested (``net.0.weight``, ``classifier.weight``); the layer order is the mapping's, or
    the one its widths chain in). ``method`` is ``"pfnm"``, ``"gpi-fnm"`` (needs ``eps > 0``) or
    ``"fedavg"``. ``sigma`` and ``sigma0`` are variances, as in the PFNM reference code;
    ``class_counts`` (one list of per-class example counts per model) weight the output
    layer, and weight FedAvg by each model's total. ``order`` is how a network of two or more
    hidden layers is matched: ``"top_down"`` (the reference code's) or ``"bottom_up"`` (each
    layer on its full fan-in; on deep MNIST networks far closer to the clients' ensemble, see
    docs/EXPERIMENTS.md). ``seed`` seeds PFNM's refinement orders.

    Returns the fused arrays (under the first model's names) and the assignments: for each hidden
    layer, which global unit each client unit joined (what ``fedfuse fuse`` writes to
    ``FUSED.assignments.json``). The result equals ``fedfuse fuse`` on the same models, bit
    for bit.
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
        str(order),
        int(seed),
    )
    return arrays_from_tensors(fused), report


def rdp_epsilon(q: float, noise_multiplier: float, steps: int, delta: float) -> tuple[float, float]:
    """Privacy spent by ``steps`` releases of the Gaussian mechanism with ``noise_multiplier``
    on a Poisson sample of rate ``q`` (``q = 1``: every client, no amplification), by RDP
    accounting on ``dp-accounting``'s default orders.

    Returns ``(epsilon, order)``: the tightest epsilon at ``delta`` and the Renyi order that
    gave it. The same accountant reports ``dp_epsilon`` in a run with ``[privacy]``.
    """
    return _rdp_epsilon(float(q), float(noise_multiplier), int(steps), float(delta))
