"""docs/FLOWER.md's loopback recipes, run as the text writes them.

Each ```sh block after a `<!-- doc-test: NAME -->` line runs with `bash -euo pipefail` in a
fresh copy of the working tree, as a newcomer would run it from the repository root: the
venv's `bin` and a folder holding `fedfuse` (the debug build) first on `PATH`, nothing else
prepared. The recipes use fixed ports (8000 for the SuperLink, 9100+ for Python SuperNodes),
so two of these tests must not run at once (pytest runs them one after the other).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from flower_harness import VENV_BIN

pytest.importorskip("flwr")
DOC = ROOT / "docs" / "FLOWER.md"
# Seconds; on 2 busy cores the recipes took 45 s (Rust nodes) and 170 s (Python nodes).
TIME_LIMIT = 480
# Seconds a recipe's runners get to notice their parent has gone.
SHUTDOWN_GRACE = 60


def doc_blocks(text: str) -> dict[str, str]:
    """NAME -> the body of the ```sh block that follows `<!-- doc-test: NAME -->`."""
    found = re.findall(r"<!-- doc-test: ([\w-]+) -->\n```sh\n(.*?)\n```", text, flags=re.S)
    names = [name for name, _ in found]
    assert len(set(names)) == len(names), f"doc-test names repeat: {names}"
    return dict(found)


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment holds `marker`: everything a recipe started, including the
    ServerApp runner the SuperLink puts in a session of its own."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
    return pids


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return "(gone)"


def run_doc_block(name: str, tmp_path: Path, fedfuse_bin: Path) -> tuple[Path, str]:
    """Runs block NAME of docs/FLOWER.md in a copy of the working tree; returns the copy and
    the block's output. Fails if the block fails, overruns, or leaves a process running."""
    script = doc_blocks(DOC.read_text())[name]
    tree = tmp_path / "repo"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", "target", "runs", "__pycache__"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fedfuse").symlink_to(fedfuse_bin.resolve())
    marker = f"fedfuse-doc-test-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env.update(PATH=os.pathsep.join([str(bin_dir), str(VENV_BIN), os.environ.get("PATH", "")]),
               FEDFUSE_DOC_TEST=marker)
    log = tmp_path / f"{name}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        # A session of its own: the whole group goes at the end, whatever happened.
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=tree, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            rc = proc.wait(timeout=TIME_LIMIT)
        except subprocess.TimeoutExpired:
            rc = None
        output = log.read_text(errors="replace")
        print(f"doc-test {name}: {time.monotonic() - start:.0f} s")
        assert rc is not None, f"{name} ran past {TIME_LIMIT} s:\n{output[-5000:]}"
        assert rc == 0, f"{name} exited {rc}:\n{output[-5000:]}"
        # The recipe stops what it started: nothing of it may outlive it. Flower's ServerApp
        # and ClientApp runners watch their parent and shut down once it has gone; on 2 cores
        # shared with a release build that took more than 15 s (CI, stop 36), so they get a
        # minute.
        stopped = time.monotonic()
        while marked_pids(marker) and time.monotonic() < stopped + SHUTDOWN_GRACE:
            time.sleep(0.5)
        survivors = {pid: command_line(pid) for pid in marked_pids(marker)}
        assert not survivors, f"{name} left processes running: {survivors}"
        print(f"doc-test {name}: its processes were gone {time.monotonic() - stopped:.1f} s after it")
        return tree, output
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in marked_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_the_doc_names_both_loopback_recipes():
    assert set(doc_blocks(DOC.read_text())) == {"loopback-python", "loopback-rust-nodes"}


def test_loopback_python_recipe_writes_the_quickstarts_results(tmp_path, fedfuse_bin):
    tree, output = run_doc_block("loopback-python", tmp_path, fedfuse_bin)
    out = tree / "runs" / "flower"
    assert out.is_dir(), f"no {out}:\n{output[-5000:]}"
    # The text promises the files of `fedfuse run` for the same config and rounds.
    sim = tmp_path / "sim"
    subprocess.run([str(fedfuse_bin), "run", str(ROOT / "examples" / "quickstart.toml"), "--set", "rounds=5",
                    "--out", str(sim), "--quiet"], check=True, capture_output=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in sim.iterdir())
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    assert len(rounds) == 5 and all(r["rejected"] == [] for r in rounds), rounds
    print(f"doc-test loopback-python: accuracy by round {[r['global_accuracy'] for r in rounds]}")
    # Measured: 0.40 after round 1, 0.88 after round 5; an untrained model about 0.1.
    assert rounds[-1]["global_accuracy"] > 0.7, rounds[-1]


def test_loopback_rust_nodes_recipe_improves_the_model_every_round(tmp_path, fedfuse_bin):
    tree, output = run_doc_block("loopback-rust-nodes", tmp_path, fedfuse_bin)
    out = tree / "runs" / "flower-rust-nodes"
    assert (out / "metrics.json").exists(), f"no {out / 'metrics.json'}:\n{output[-5000:]}"
    metrics = json.loads((out / "metrics.json").read_text())
    # The block asks for num-rounds=5; each round's accuracy is the five nodes' evaluate
    # replies, weighted by their examples.
    accuracy = [metrics["evaluate"][str(r)]["accuracy"] for r in range(1, 6)]
    assert sorted(metrics["evaluate"]) == ["1", "2", "3", "4", "5"], metrics
    print(f"doc-test loopback-rust-nodes: accuracy by round {[round(a, 3) for a in accuracy]}")
    # Measured: 0.61 after round 1, 0.90 after round 5; untrained about 0.1.
    assert accuracy[-1] > 0.75 and accuracy[-1] > accuracy[0] + 0.2, accuracy
    # The streamed log shows the ServerApp's table, one line per round.
    assert "round  accuracy  loss" in output, output[-3000:]
    model = dict(np.load(out / "model.npz"))
    assert {k: v.shape for k, v in model.items()} == {
        "layers.0.weight": (64, 64), "layers.0.bias": (64,),
        "layers.1.weight": (10, 64), "layers.1.bias": (10,),
    }
    # Flower's FedAvg itself counted every node's reply in every round.
    assert output.count("aggregate_train: Received 5 results and 0 failures") == 5, output[-3000:]
