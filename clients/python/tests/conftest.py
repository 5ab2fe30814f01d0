"""Starts a real idemnode --dev for the tests: IDEM_NODE_BIN names the binary
(the Go test builds it); without it the binary is built from this repository
with `go build`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

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


@pytest.fixture(scope="session")
def node():
    tmp = Path(tempfile.mkdtemp(prefix="idem-py-"))
    binary = os.environ.get("IDEM_NODE_BIN")
    if not binary:
        binary = str(tmp / "idemnode")
        subprocess.run(["go", "build", "-o", binary, "./cmd/idemnode"], cwd=REPO, check=True)
    http, grpc, raft = free_port(), free_port(), free_port()
    log = tmp / "node.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, "--dev", "--http-addr", f"127.0.0.1:{http}", "--grpc-addr", f"127.0.0.1:{grpc}",
                                 "--raft-addr", f"127.0.0.1:{raft}", "--data-dir", str(tmp / "data"),
                                 "--clock-skew-margin", "100ms", "--log-level", "warn"], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + 60
    last = "no answer yet"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"idemnode exited {proc.returncode} before it was ready:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError as e:
            last = repr(e)
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"idemnode not ready within 60 s (last: {last}):\n{log.read_text()}")
        time.sleep(0.1)
    yield DevNode(url, proc, log)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
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
