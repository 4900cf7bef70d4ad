"""Rust SuperNodes against Python SuperNodes (docs/BENCHMARKS.md, "fedfuse flower-node").

    bash scripts/bench-flower-nodes.sh [--nodes 20] [--rounds 2 6]

Flower's own FedAvg ServerApp (python/tests/apps/numpy_mlp, no fedfuse on the server) on a
loopback SuperLink, first with N `fedfuse flower-node` processes (the digits quickstart, N
client slots), then with N `flower-supernode`s running the numpy ClientApp on N digits
partitions. Both train the 64-64-10 MLP for 2 epochs of batch 16 per round. A round's time
is the difference between runs of the two round counts, over their difference. Memory is
resident set size, sampled every 0.2 s: for a Rust node its one process, for a Python node
the sum over its process group (the SuperNode, its SuperExec and the ClientApp process of the
message being run), as median-over-nodes of each node's peak.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python" / "tests"), str(ROOT / "scripts")]

from flower_harness import Deployment  # noqa: E402
from numpy_digits import write_partitions  # noqa: E402
from proc_memory import PeakRss  # noqa: E402

NUMPY_APP = ROOT / "python" / "tests" / "apps" / "numpy_mlp"
CONFIG = ROOT / "examples" / "flower" / "fedfuse_quickstart" / "run.toml"
FEDFUSE = ROOT / "target" / "release" / "fedfuse"


def measure(name: str, d: Deployment, nodes: list[str], run_config: str, rounds: tuple[int, int]):
    wall = {}
    with PeakRss(d.procs, nodes) as rss:
        for r in rounds:
            start = time.perf_counter()
            d.run(NUMPY_APP, f"{run_config} rounds={r}", timeout=3600)
            wall[r] = time.perf_counter() - start
    lo, hi = rounds
    per_round = (wall[hi] - wall[lo]) / (hi - lo)
    peaks_mb = [rss.peak[n] / 1024 for n in nodes]
    print(
        f"| {name} | {len(nodes)} | {wall[lo]:.1f} s | {wall[hi]:.1f} s | {per_round:.2f} s "
        f"| {statistics.median(peaks_mb):.0f} MB | {max(peaks_mb):.0f} MB |",
        flush=True,
    )
    return per_round, statistics.median(peaks_mb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--rounds", type=int, nargs=2, default=(2, 6))
    args = parser.parse_args()
    n, rounds = args.nodes, tuple(args.rounds)
    common = 'strategy="flower-fedavg" epochs=2 lr=0.05 batch-size=16 round-timeout=1200.0'
    print(f"| nodes (loopback, Flower's FedAvg) | N | {rounds[0]} rounds | {rounds[1]} rounds "
          "| per round | peak RSS per node (median) | (max) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_partitions(tmp / "data", n)
        results = {}
        d = Deployment(tmp / "rust", nodes=0)
        try:
            d.start()
            names = []
            for i in range(n):
                names.append(f"rust{i}")
                d._spawn(names[-1], [
                    str(FEDFUSE), "flower-node", "--insecure", "--superlink", f"127.0.0.1:{d.port}",
                    "--config", str(CONFIG), "--partition-id", str(i), "--set", f"clients={n}",
                ])
            d._wait(lambda: all("joined" in d.log(x) for x in names), 300, "the Rust nodes to join")
            results["rust"] = measure("`fedfuse flower-node` (Rust)", d, names, common, rounds)
        finally:
            d.stop()
        d = Deployment(tmp / "python", nodes=n)
        try:
            d.start()
            names = [f"node{i}" for i in range(n)]
            results["python"] = measure(
                "`flower-supernode` + numpy ClientApp (Python)", d, names,
                f'{common} data-dir="{tmp / "data"}"', rounds,
            )
        finally:
            d.stop()
    (rt, rm), (pt, pm) = results["rust"], results["python"]
    print(f"\nRust / Python: round time {rt / pt:.2f}x, memory per node {rm / pm:.3f}x")


if __name__ == "__main__":
    main()
