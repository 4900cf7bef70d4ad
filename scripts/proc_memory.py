"""Resident memory of the processes a benchmark started (Linux /proc), for the node benchmarks."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def rss_kib(pid: int) -> int:
    """Resident set size of `pid` in KiB; 0 once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def group_pids(pgid: int) -> list[int]:
    """The processes of process group `pgid`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # stat's 5th field (after pid and comm) is the pgrp
            pids.append(int(entry.name))
    return pids


class PeakRss:
    """Each named process group's peak resident memory in KiB, sampled in the background
    every `every` seconds (a Rust node is one process; a Python SuperNode is its group: the
    SuperNode, its SuperExec and the ClientApp process of the message it runs)."""

    def __init__(self, procs: dict, names: list[str], every: float = 0.2):
        self.procs, self.names, self.every = procs, names, every
        self.peak = {n: 0 for n in names}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.done.is_set():
            for n in self.names:
                total = sum(rss_kib(p) for p in group_pids(self.procs[n].pid))
                self.peak[n] = max(self.peak[n], total)
            time.sleep(self.every)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
