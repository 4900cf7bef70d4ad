"""Writes examples/fuse/mnist-train-64.npz: the first 64 MNIST training images as fedfuse reads
them (pixels / 255, shape [64, 1, 28, 28], float32), the inputs the ResNet guide re-estimates
a fused model's batch norms on (`fedfuse fuse --reset-bn`). Needs numpy and the MNIST files
beside the repository (../shared/data/mnist).

    target/flower-venv/bin/python scripts/make-bn-samples.py
"""

import gzip
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MNIST = ROOT.parent / "shared" / "data" / "mnist"


def read_images(path: Path) -> np.ndarray:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    magic, n, rows, cols = np.frombuffer(raw[:16], dtype=">u4")
    assert magic == 2051, f"{path}: not an IDX image file"
    return np.frombuffer(raw[16:], dtype=np.uint8).reshape(n, 1, rows, cols)


def main() -> None:
    path = next(p for p in sorted(MNIST.glob("train-images*")))
    images = read_images(path)[:64].astype(np.float32) / 255.0
    out = ROOT / "examples" / "fuse" / "mnist-train-64.npz"
    np.savez_compressed(out, x=images)
    print(f"wrote {out} ({out.stat().st_size} bytes) from {path}")


if __name__ == "__main__":
    main()
