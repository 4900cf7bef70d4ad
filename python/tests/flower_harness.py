"""A real Flower deployment on 127.0.0.1 for tests: one SuperLink, N SuperNodes, `flwr run`.

Every process gets its own FLWR_HOME and ports, and is stopped (by PID) when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Deployment:
    def __init__(self, home: Path, nodes: int, num_partitions: int | None = None):
        self.home = home
        self.nodes = nodes
        self.num_partitions = num_partitions or nodes
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = free_port()
        self.env = dict(
            os.environ,
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            FLWR_HOME=str(home / "flwrhome"),
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1",
        )
        (home / "flwrhome").mkdir(parents=True, exist_ok=True)
        (home / "flwrhome" / "config.toml").write_text(
            '[superlink]\ndefault = "e2e"\n[superlink.e2e]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.home / f"{name}.log", "w")
        # Its own process group, so that killing a SuperNode also kills the ClientApp
        # process it started.
        self.procs[name] = subprocess.Popen(
            args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.home,
            start_new_session=True,
        )

    def log(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text(errors="replace")

    def start(self) -> "Deployment":
        self._spawn("superlink", [
            "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-runtime-dependency-installation",
        ])
        self._wait(lambda: self._healthy(), 60, "the SuperLink to answer /health")
        for i in range(self.nodes):
            self.start_node(i)
        self._wait(
            lambda: all("SuperNode ID:" in self.log(f"node{i}") for i in range(self.nodes)),
            120,
            "every SuperNode to register",
        )
        return self

    def start_node(self, i: int) -> None:
        self._spawn(f"node{i}", [
            "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
            "--host", "127.0.0.1", "--port", str(free_port()),
            "--node-config", f"partition-id={i} num-partitions={self.num_partitions}",
        ])

    def kill(self, name: str) -> None:
        """Kills a process and its children at once (SIGKILL: no goodbye to the SuperLink)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                return True
        except OSError:
            return False

    def _wait(self, ready, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}) waiting for {what}:\n{self.log(name)[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {seconds} s for {what}")
            time.sleep(0.25)

    def run(self, app: Path, run_config: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`flwr run` to the end of the run; fails the test with both logs if it fails."""
        done = self.submit(app, run_config)
        out, err = done.communicate(timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"flwr run failed ({done.returncode}):\n{out[-4000:]}\n{err[-4000:]}")
        return subprocess.CompletedProcess(done.args, done.returncode, out, err)

    def submit(self, app: Path, run_config: str) -> subprocess.Popen:
        """Starts `flwr run` and returns at once."""
        return subprocess.Popen(
            ["flwr", "run", str(app), "e2e", "--stream", "--run-config", run_config],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.home,
        )

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=20)
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@contextlib.contextmanager
def deployment(home: Path, nodes: int):
    d = Deployment(home, nodes)
    try:
        yield d.start()
    finally:
        d.stop()
