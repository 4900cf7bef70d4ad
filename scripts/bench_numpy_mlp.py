"""numpy reference for `fedfuse bench train`: the same MLP 784-100-10 (ReLU, softmax
cross-entropy, plain SGD), one epoch over MNIST's 60,000 training images, batch 64, one thread.

    OPENBLAS_NUM_THREADS=1 python3 scripts/bench_numpy_mlp.py ../shared/data/mnist [repeats]
"""
import gzip
import os
import struct
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
import numpy as np  # noqa: E402


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def epoch(x, y, rng, batch=64, lr=0.01):
    w1 = rng.uniform(-1 / 28, 1 / 28, (784, 100)).astype(np.float32)
    b1 = np.zeros(100, np.float32)
    w2 = rng.uniform(-0.1, 0.1, (100, 10)).astype(np.float32)
    b2 = np.zeros(10, np.float32)
    order = rng.permutation(len(x))
    eye = np.eye(10, dtype=np.float32)
    for s in range(0, len(x), batch):
        idx_ = order[s : s + batch]
        xb, yb = x[idx_], y[idx_]
        h = np.maximum(xb @ w1 + b1, 0)
        z = h @ w2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        dz = (p - eye[yb]) / len(idx_)
        dw2 = h.T @ dz
        dh = (dz @ w2.T) * (h > 0)
        dw1 = xb.T @ dh
        w2 -= lr * dw2
        b2 -= lr * dz.sum(0)
        w1 -= lr * dw1
        b1 -= lr * dh.sum(0)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/mnist"
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    x = (idx(os.path.join(root, "train-images-idx3-ubyte.gz")).reshape(-1, 784) / 255.0).astype(
        np.float32
    )
    y = idx(os.path.join(root, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        epoch(x, y, rng)
        times.append(time.perf_counter() - t)
    times.sort()
    med = times[len(times) // 2]
    print(
        f"numpy {np.__version__} MLP 784-100-10: {len(x)} samples, batch 64: median {med:.3f} s/epoch "
        f"(min {times[0]:.3f}, max {times[-1]:.3f}) = {len(x) / med:.0f} samples/s"
    )


if __name__ == "__main__":
    main()
