"""Python side of the interop check: a model fedfuse saved loads with the `safetensors` package
under PyTorch names and layouts ([out, in]), and predicts like a trained network.

    python scripts/interop_check.py RUN_DIR
"""
import gzip
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def main():
    run = sys.argv[1]
    results = json.load(open(os.path.join(run, "results.json")))
    w = load_file(os.path.join(run, "model.safetensors"))
    hidden = results["config"]["model"]["hidden"]
    widths = [64] + hidden + [10]
    for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        assert w[f"layers.{i}.weight"].shape == (fan_out, fan_in), w[f"layers.{i}.weight"].shape
        assert w[f"layers.{i}.bias"].shape == (fan_out,)
        assert w[f"layers.{i}.weight"].dtype == np.float32
    n_params = sum(v.size for v in w.values())
    assert n_params == results["rounds"][-1]["global_params"], n_params

    here = os.path.dirname(os.path.abspath(__file__))
    rows = np.loadtxt(gzip.open(os.path.join(here, "../crates/data/assets/digits.csv.gz")), delimiter=",")
    x, y = rows[:, :64] / 16.0, rows[:, 64].astype(int)
    for i in range(len(widths) - 1):
        x = x @ w[f"layers.{i}.weight"].T + w[f"layers.{i}.bias"]
        if i < len(widths) - 2:
            x = np.maximum(x, 0)
    acc = float((x.argmax(1) == y).mean())
    reported = results["final"]["global_accuracy"]
    print(f"interop: numpy forward pass of the saved model: {acc:.4f} on all 1797 digits "
          f"(fedfuse reported {reported:.4f} on its test split)")
    # A transposed or misnamed tensor gives chance level (~0.1).
    assert acc > 0.85 and abs(acc - reported) < 0.06, (acc, reported)
    print("interop: 1 passed, 0 failed")


if __name__ == "__main__":
    main()
