"""Regenerates the .npz fixtures of crates/core/tests/npz.rs (numpy 2.x): `python3 make_fixtures.py`.

The tests do not need Python: the files are checked in, and the expected values are written
out in the test.
"""
import numpy as np

arrays = {
    "layers.10.weight": np.array([[1.5, -2.25], [0.125, 4.0]], dtype="<f4"),
    "layers.2.weight": np.array([[1.0, 2.0, 3.0], [-0.5, 1e-3, 6.0]], dtype=">f8"),
    "layers.2.bias": np.array([0.5, -1.0, 65504.0], dtype="<f2"),
    "fortran": np.asfortranarray(np.arange(24, dtype="<f4").reshape(2, 3, 4)),
    "scalar": np.array(3.5, dtype="<f4"),
    "empty": np.zeros((0, 3), dtype="<f4"),
}
assert arrays["fortran"].flags["F_CONTIGUOUS"] and not arrays["fortran"].flags["C_CONTIGUOUS"]
np.savez("numpy_stored.npz", **arrays)
np.savez_compressed("numpy_compressed.npz", **arrays)
np.savez("numpy_int.npz", **{"layers.0.weight": np.ones((2, 2), dtype="<f4"), "steps": np.array([1, 2], dtype="<i8")})
