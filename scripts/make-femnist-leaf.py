"""Synthetic FEMNIST in LEAF's layout, for benchmarks of fedfuse's reader and of writer-sized
federations (no real data: random images, labels cycling over the 62 classes).

    target/flower-venv/bin/python scripts/make-femnist-leaf.py OUT --writers 3597 \
        --train 20 --test 3 [--shards 36] [--seed 0]

writes OUT/train/*.json and OUT/test/*.json as LEAF's preprocessing names them, each writer
with `--train` training and `--test` test images (784 values in [0, 1], 4 decimals), the
writers spread over `--shards` files.
"""

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--writers", type=int, default=3597)
    ap.add_argument("--train", type=int, default=20)
    ap.add_argument("--test", type=int, default=3)
    ap.add_argument("--shards", type=int, default=36)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    names = [f"f{w:04d}_{w % 100:02d}" for w in range(args.writers)]
    label = 0
    for split, n in (("train", args.train), ("test", args.test)):
        folder = args.out / split
        folder.mkdir(parents=True, exist_ok=True)
        for s in range(args.shards):
            mine = names[s::args.shards]
            data = {}
            for name in mine:
                x = np.round(rng.random((n, 784)), 4)
                y = [(label + 7 * k) % 62 for k in range(n)]
                label = (label + 1) % 62
                data[name] = {"x": x.tolist(), "y": y}
            shard = {"users": mine, "num_samples": [n] * len(mine), "user_data": data}
            path = folder / f"all_data_{s}_niid_1_keep_0_{split}_9.json"
            path.write_text(json.dumps(shard))
    print(f"{args.writers} writers, {args.writers * args.train} train and "
          f"{args.writers * args.test} test images in {args.out}")


if __name__ == "__main__":
    main()
