"""Starts a real idemnode --dev for the tests: IDEM_NODE_BIN names the binary
(the Go test builds it); without it the binary is built from this repository
with `go build`."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package, without installing it
REPO = HERE.parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DevNode:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path):
        self.url = url
        self.proc = proc
        self.log = log


def _binary(tmp: Path, env: str, pkg: str, name: str) -> str:
    if os.environ.get(env):
        return os.environ[env]
    out = str(tmp / name)
    subprocess.run(["go", "build", "-o", out, pkg], cwd=REPO, check=True)
    return out


def make_certs(tmp: Path, client: str) -> Path:
    """A CA, a node certificate for 127.0.0.1 and a client certificate for
    ``client``, made with idemctl (IDEM_CTL_BIN, else built), in tmp/certs."""
    ctl = _binary(tmp, "IDEM_CTL_BIN", "./cmd/idemctl", "idemctl")
    certs = tmp / "certs"
    subprocess.run([ctl, "cert", "create-ca", "--certs-dir", str(certs)], check=True, capture_output=True)
    subprocess.run([ctl, "cert", "create-node", "--certs-dir", str(certs), "--id", "dev", "127.0.0.1"], check=True, capture_output=True)
    subprocess.run([ctl, "cert", "create-client", "--certs-dir", str(certs), client], check=True, capture_output=True)
    return certs


def start_node(tmp: Path, certs: Optional[Path] = None, auth_file: Optional[Path] = None) -> DevNode:
    """Starts idemnode --dev on free loopback ports with a 100 ms clock-skew
    margin and waits up to 60 s for /readyz 200; with certs, TLS."""
    binary = _binary(tmp, "IDEM_NODE_BIN", "./cmd/idemnode", "idemnode")
    http, grpc, raft = free_port(), free_port(), free_port()
    log = tmp / "node.log"
    args = [binary, "--dev", "--http-addr", f"127.0.0.1:{http}", "--grpc-addr", f"127.0.0.1:{grpc}",
            "--raft-addr", f"127.0.0.1:{raft}", "--data-dir", str(tmp / "data"), "--clock-skew-margin", "100ms", "--log-level", "warn"]
    if certs:
        args += ["--certs-dir", str(certs)]
    if auth_file:
        args += ["--auth-file", str(auth_file)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    url = f"{'https' if certs else 'http'}://127.0.0.1:{http}"
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt")) if certs else None
    deadline = time.monotonic() + 60
    last = "no answer yet"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"idemnode exited {proc.returncode} before it was ready:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2, context=ctx) as r:
                if r.status == 200:
                    break
        except OSError as e:
            last = repr(e)
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"idemnode not ready within 60 s (last: {last}):\n{log.read_text()}")
        time.sleep(0.1)
    return DevNode(url, proc, log)


def stop_node(n: DevNode) -> None:
    """Stops the node; fails when it reported a data race (a -race build)."""
    n.proc.terminate()
    try:
        n.proc.wait(10)
    except subprocess.TimeoutExpired:
        n.proc.kill()
        n.proc.wait()
    log = n.log.read_text(errors="replace")
    race = log.find("WARNING: DATA RACE")
    if race >= 0:
        raise AssertionError(f"idemnode reported a data race:\n{log[race:race + 4000]}")


@pytest.fixture(scope="session")
def node():
    tmp = Path(tempfile.mkdtemp(prefix="idem-py-"))
    n = start_node(tmp)
    yield n
    try:
        stop_node(n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def spawn_until(args, prefix: str, timeout: float = 30.0):
    """Starts `python3 args...` and returns (proc, line) once it prints a line
    starting with prefix."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(deadline - time.monotonic(), 0.01)):
            continue
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return proc, line.strip()
        if line == "":
            raise RuntimeError(f"child exited {proc.wait()} before printing {prefix!r}: {proc.stderr.read()}")
    proc.kill()
    raise RuntimeError(f"child did not print {prefix!r} within {timeout}s")
