"""A real Flower deployment on 127.0.0.1 for tests: one SuperLink, N SuperNodes, `flwr run`.

Every process gets its own FLWR_HOME and ports, and is stopped (by PID) when the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
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


def mint_tls(folder: Path) -> dict[str, Path]:
    """A CA and a SuperLink certificate for 127.0.0.1 signed by it, plus a second CA that
    signed nothing: `ca`, `cert`, `key`, `other_ca` (PEM files)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject, key, issuer, issuer_key, ca):
        b = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            b = b.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return b.sign(issuer_key, hashes.SHA256())

    def write(path, pem):
        path.write_bytes(pem)
        return path

    def key_pem(k):
        return k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key, other_key, server_key = (ec.generate_private_key(ec.SECP384R1()) for _ in range(3))
    ca = cert("fedfuse test CA", ca_key, "fedfuse test CA", ca_key, True)
    other = cert("another CA", other_key, "another CA", other_key, True)
    server = cert("127.0.0.1", server_key, "fedfuse test CA", ca_key, False)
    pem = serialization.Encoding.PEM
    return {
        "ca": write(folder / "ca.crt", ca.public_bytes(pem)),
        "other_ca": write(folder / "other-ca.crt", other.public_bytes(pem)),
        "cert": write(folder / "server.pem", server.public_bytes(pem)),
        "key": write(folder / "server.key", key_pem(server_key)),
    }


def node_key(path: Path) -> Path:
    """A node key as `ssh-keygen -t ecdsa -b 384 -N ""` writes it (OpenSSH private key at
    `path`, public key at `path`.pub)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)  # as ssh-keygen leaves it; the Rust node refuses a key others can read
    path.with_suffix(".pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return path


class Deployment:
    def __init__(
        self,
        home: Path,
        nodes: int,
        num_partitions: int | None = None,
        tls: dict[str, Path] | None = None,
        auth: bool = False,
    ):
        """`tls` (from `mint_tls`) serves the SuperLink over TLS; `auth` turns node
        authentication on (it needs TLS)."""
        self.home = home
        self.nodes = nodes
        self.num_partitions = num_partitions or nodes
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()  # killed on purpose: not a failure while waiting
        self.tls = tls
        self.auth = auth
        self.port = free_port()
        self.env = dict(
            os.environ,
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            FLWR_HOME=str(home / "flwrhome"),
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1",
        )
        (home / "flwrhome").mkdir(parents=True, exist_ok=True)
        security = f'root-certificates = "{tls["ca"]}"' if tls else "insecure = true"
        (home / "flwrhome" / "config.toml").write_text(
            '[superlink]\ndefault = "e2e"\n[superlink.e2e]\n'
            f'address = "127.0.0.1:{self.port}"\n{security}\n'
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        self.killed.discard(name)
        log = open(self.home / f"{name}.log", "w")
        # Its own process group, so that killing a SuperNode also kills the ClientApp
        # process it started.
        self.procs[name] = subprocess.Popen(
            args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.home,
            start_new_session=True,
        )

    def log(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text(errors="replace")

    def start_superlink(self) -> None:
        if self.tls:
            security = [
                "--ssl-ca-certfile", str(self.tls["ca"]), "--ssl-certfile", str(self.tls["cert"]),
                "--ssl-keyfile", str(self.tls["key"]),
            ]
        else:
            security = ["--insecure"]
        if self.auth:
            security.append("--enable-supernode-auth")
        self._spawn("superlink", [
            "flower-superlink", *security, "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-runtime-dependency-installation",
        ])
        self._wait(lambda: self._healthy(), 180, "the SuperLink to answer /health")

    def register(self, public_key: Path) -> int:
        """`flwr supernode register`: the SuperLink learns a node's key; returns its node id."""
        done = subprocess.run(
            ["flwr", "supernode", "register", str(public_key), "e2e", "--format", "json"],
            env=self.env, capture_output=True, text=True, cwd=self.home, timeout=60,
        )
        if done.returncode != 0:
            raise AssertionError(f"flwr supernode register failed:\n{done.stdout}\n{done.stderr}")
        return int(json.loads(done.stdout)["node-id"])

    def start(self) -> "Deployment":
        self.start_superlink()
        for i in range(self.nodes):
            self.start_node(i)
        # A port `free_port` found free can be taken before the node binds it (every HTTP
        # connection on the machine draws its source port from the same range): such a node
        # is started again on another port.
        for attempt in range(4):
            try:
                self._wait(
                    lambda: all("SuperNode ID:" in self.log(f"node{i}") for i in range(self.nodes)),
                    120,
                    "every SuperNode to register",
                )
                return self
            except RuntimeError:
                clashed = [
                    i for i in range(self.nodes)
                    if self.procs[f"node{i}"].poll() is not None
                    and "address already in use" in self.log(f"node{i}")
                ]
                if not clashed or attempt == 3:
                    raise
                for i in clashed:
                    self.start_node(i)
        return self

    def start_node(self, i: int) -> None:
        self._spawn(f"node{i}", [
            "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
            "--host", "127.0.0.1", "--port", str(free_port()),
            "--node-config", f"partition-id={i} num-partitions={self.num_partitions}",
        ])

    def kill(self, name: str) -> None:
        """Kills a process and its children at once (SIGKILL: no goodbye to the SuperLink)."""
        self.killed.add(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def _healthy(self) -> bool:
        scheme, context = "http", None
        if self.tls:
            scheme, context = "https", ssl.create_default_context(cafile=str(self.tls["ca"]))
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.port}/health", timeout=1, context=context):
                return True
        except OSError:
            return False

    def _wait(self, ready, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            for name, p in self.procs.items():
                if name not in self.killed and p.poll() is not None:
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
def deployment(home: Path, nodes: int, **kwargs):
    d = Deployment(home, nodes, **kwargs)
    try:
        yield d.start()
    finally:
        d.stop()
