"""How many Rust SuperNodes one SuperLink carries (docs/BENCHMARKS.md, "Nodes per SuperLink").

    target/flower-venv/bin/python scripts/soak-rust-nodes.py [--nodes 10 50 100 200]
        [--python-nodes 10 20] [--rounds 3] [--idle 30]

For each N: a loopback SuperLink, N `fedfuse flower-node`s (the digits quickstart with
`clients=N`, Dirichlet(2) partitions of at least 2 samples: the smallest once sent no
local accuracy, and Flower's FedAvg refused the round), then Flower's own FedAvg
ServerApp (python/tests/apps/numpy_mlp, no fedfuse on the server) for `--rounds` rounds with
every node in every round. Reported: the SuperLink's CPU (its own process, % of one core)
while the nodes sit idle and during the run, the run's time per round (wall time of `flwr
run` over its rounds, start-up included), the results and failures Flower's FedAvg counted in
each train and evaluate phase, and each node's peak memory. Then the idle cost of Flower's
own SuperNodes (`flower-supernode`, about 385 MB each) for the `--python-nodes` counts, for
the polling cost per node. Needs the release build (`cargo build --release -p fedfuse`) and
the Flower venv (scripts/flower-venv.sh).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python" / "tests"), str(ROOT / "scripts")]

from flower_harness import Deployment  # noqa: E402
from proc_memory import PeakRss  # noqa: E402

NUMPY_APP = ROOT / "python" / "tests" / "apps" / "numpy_mlp"
CONFIG = ROOT / "examples" / "flower" / "fedfuse_quickstart" / "run.toml"
FEDFUSE = ROOT / "target" / "release" / "fedfuse"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime: stat's fields 14, 15


def superlink_cpu(d: Deployment, seconds: float) -> float:
    """The SuperLink's CPU over the next `seconds`, in % of one core."""
    pid = d.procs["superlink"].pid
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - before) / (time.monotonic() - start)


def phase_counts(log: str, phase: str) -> list[tuple[int, int]]:
    """(results, failures) of each round's `phase` as Flower's FedAvg logged them."""
    found = re.findall(rf"aggregate_{phase}: Received (\d+) results and (\d+) failures", log)
    return [(int(r), int(f)) for r, f in found]


def rust_nodes(tmp: Path, n: int, rounds: int, idle: float) -> str:
    d = Deployment(tmp / f"rust{n}", nodes=0)
    try:
        d.start()
        names = [f"rust{i}" for i in range(n)]
        for i, name in enumerate(names):
            d._spawn(name, [
                str(FEDFUSE), "flower-node", "--insecure", "--superlink", f"127.0.0.1:{d.port}",
                "--config", str(CONFIG), "--partition-id", str(i), "--set", f"clients={n}",
                "--set", "partition.min_partition_size=2", "--set", "partition.alpha=2",
            ])
        d._wait(lambda: all("joined" in d.log(x) for x in names), 900, "the Rust nodes to join")
        idle_cpu = superlink_cpu(d, idle)
        with PeakRss(d.procs, names, every=1.0) as rss:
            pid = d.procs["superlink"].pid
            before, start = cpu_seconds(pid), time.monotonic()
            done = d.run(
                NUMPY_APP,
                f'strategy="flower-fedavg" rounds={rounds} epochs=2 lr=0.05 batch-size=16 '
                "round-timeout=1200.0",
                timeout=3 * 3600,
            )
            wall = time.monotonic() - start
            busy_cpu = 100 * (cpu_seconds(pid) - before) / wall
        log = done.stdout + done.stderr
        train, evaluate = phase_counts(log, "train"), phase_counts(log, "evaluate")
        peaks = [rss.peak[x] / 1024 for x in names]
        counts = lambda c: " ".join(f"{r}/{f}" for r, f in c) or "none logged"  # noqa: E731
        return (
            f"| {n} | {wall / rounds:.1f} s | {counts(train)} | {counts(evaluate)} "
            f"| {busy_cpu:.0f}% | {idle_cpu:.0f}% | {statistics.median(peaks):.0f} MB "
            f"({max(peaks):.0f}) |"
        )
    finally:
        d.stop()


def python_nodes(tmp: Path, n: int, idle: float) -> str:
    d = Deployment(tmp / f"python{n}", nodes=n)
    try:
        d.start()
        cpu = superlink_cpu(d, idle)
        return f"| {n} Flower SuperNodes (Python), idle | {cpu:.0f}% | {cpu / n:.2f}% |"
    finally:
        d.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--python-nodes", type=int, nargs="*", default=[10, 20])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("| Rust nodes | time per round | train results/failures per round "
              "| evaluate results/failures | SuperLink CPU, run | SuperLink CPU, idle "
              "| node peak RSS, median (max) |")
        print("|---|---|---|---|---|---|---|", flush=True)
        idle_per_node = {}
        for n in args.nodes:
            line = rust_nodes(tmp, n, args.rounds, args.idle)
            print(line, flush=True)
            idle_per_node[n] = float(line.split("|")[6].strip().rstrip("%")) / n
        print("\n| idle nodes | SuperLink CPU | per node |\n|---|---|---|")
        for n, per in idle_per_node.items():
            print(f"| {n} `fedfuse flower-node`s (Rust), idle | {per * n:.0f}% | {per:.2f}% |")
        for n in args.python_nodes:
            print(python_nodes(tmp, n, args.idle), flush=True)


if __name__ == "__main__":
    main()
