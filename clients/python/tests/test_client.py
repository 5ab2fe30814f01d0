"""The sync and asyncio clients against a real idemnode --dev: every v1 call,
run(), once(), retries of 503, lease loss and a killed owner."""

import asyncio
import json
import socket
import struct
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
import urllib.request

import pytest

from conftest import spawn_until
from idem_client import (AsyncClient, Client, FailedPreconditionError, FingerprintMismatchError, InProgressError,
                         InvalidArgumentError, LeaseLostError, NotFoundError, NotOwnerError, PayloadTooLargeError,
                         PermanentError, Response, UnavailableError)

NS = "py-client"
HERE = Path(__file__).resolve().parent


def new_key() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def client(node):
    return Client(node.url)


def test_every_call_and_error_code(client):
    key = f"order:{new_key()}/a%b?c#d"  # ':' '/' '%' '?' '#' travel encoded
    first = client.reserve(NS, key, fingerprint="fp-1", lease_ms=5000)
    assert first.outcome == "ACQUIRED"
    assert isinstance(first.fencing_token, int) and len(first.owner_token) >= 16
    again = client.reserve(NS, key, fingerprint="fp-1", owner_token=first.owner_token)
    assert (again.outcome, again.fencing_token) == ("ACQUIRED", first.fencing_token)
    other = client.reserve(NS, key, fingerprint="fp-1")
    assert other.outcome == "IN_PROGRESS" and other.retry_after > 0
    assert client.reserve(NS, key, fingerprint="fp-2").outcome == "FINGERPRINT_MISMATCH"

    assert client.heartbeat(NS, key, first.owner_token, lease_ms=20_000) > first.lease_expires_at
    with pytest.raises(NotOwnerError):
        client.heartbeat(NS, key, "x" * 22)
    rec = client.get(NS, key)
    assert (rec.state, rec.fingerprint, rec.fencing_token) == ("IN_PROGRESS", "fp-1", first.fencing_token)

    body = bytes([0, 1, 2, 255, 10])
    completed_at, expires_at = client.complete(NS, key, first.owner_token, Response(201, {"Content-Type": "application/octet-stream"}, body), retention_s=600)
    assert expires_at > completed_at
    replay = client.reserve(NS, key, fingerprint="fp-1")
    assert replay.outcome == "COMPLETED"
    assert replay.response == Response(201, {"Content-Type": "application/octet-stream"}, body)
    assert client.get(NS, key).response.body == body
    with pytest.raises(NotOwnerError):
        client.release(NS, key, first.owner_token)
    assert client.get(NS, f"absent-{new_key()}") is None
    with pytest.raises(InvalidArgumentError) as e:
        client.reserve("Bad Namespace", "k")
    assert e.value.status == 400
    with pytest.raises(InvalidArgumentError):
        client.release(NS, key, "bad token!")


def test_release_and_operator_actions(client):
    ns = f"py-ops-{int(time.time() * 1000)}"
    a = client.reserve(ns, "stuck")
    b = client.reserve(ns, "done")
    client.complete(ns, "done", b.owner_token, (200, {}, b""))
    page = client.list_keys(ns, limit=10)
    assert sorted(f"{k.key}={k.state}" for k in page.keys) == ["done=COMPLETED", "stuck=IN_PROGRESS"]
    assert [k.key for k in client.list_keys(ns, state="IN_PROGRESS").keys] == ["stuck"]
    assert client.force_release(ns, "stuck", "test") == a.fencing_token
    with pytest.raises(NotOwnerError):
        client.heartbeat(ns, "stuck", a.owner_token)
    nxt = client.reserve(ns, "stuck")
    assert (nxt.outcome, nxt.previous_fencing_token) == ("RECLAIMED", a.fencing_token)
    with pytest.raises(FailedPreconditionError):
        client.force_release(ns, "done", "test")
    client.release(ns, "stuck", nxt.owner_token)
    assert client.reserve(ns, "stuck").fencing_token > nxt.fencing_token
    client.delete_key(ns, "done", "test")
    assert client.get(ns, "done") is None
    assert client.reserve(ns, "done").fencing_token > b.fencing_token
    with pytest.raises(NotFoundError):
        client.delete_key(ns, "never", "test")


def test_503_is_retried_after_retry_after_with_the_same_owner_token(node):
    seen = []
    failed = set()

    class Hop(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append((self.path, body, time.monotonic()))
            if self.path not in failed:
                failed.add(self.path)
                out = json.dumps({"error": {"code": "UNAVAILABLE", "message": "no leader reachable"}}).encode()
                self.send_response(503)
                self.send_header("Retry-After", "1")
            else:
                req = urllib.request.Request(node.url + self.path, data=body, method="POST", headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req) as r:
                    out = r.read()
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    hop = ThreadingHTTPServer(("127.0.0.1", 0), Hop)
    threading.Thread(target=hop.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{hop.server_address[1]}"
        res = Client(url).reserve(NS, new_key())
        assert res.outcome == "ACQUIRED"
        assert len(seen) == 2
        tokens = [json.loads(b)["owner_token"] for _, b, _ in seen]
        assert tokens[0] == tokens[1] == res.owner_token
        assert seen[1][2] - seen[0][2] >= 0.9, "the retry waited for Retry-After"
        with pytest.raises(UnavailableError) as e:
            Client(url, max_attempts=1).reserve(NS, new_key())
        assert e.value.retry_after == 1.0
    finally:
        hop.shutdown()


def _count_attempts(c):
    attempts = []
    inner = c.transport.attempt

    def counted(*args, **kwargs):
        attempts.append(args[1])
        return inner(*args, **kwargs)

    c.transport.attempt = counted
    return attempts


def test_a_body_over_the_limit_is_payload_too_large_at_once(node):
    # The node answers 413 without reading a body over its limit and closes
    # the connection while the client still sends: one attempt, no retry.
    c = Client(node.url)
    attempts = _count_attempts(c)
    res_key = new_key()
    res = c.reserve(NS, res_key)
    attempts.clear()
    with pytest.raises(PayloadTooLargeError) as e:
        c.complete(NS, res_key, res.owner_token, Response(200, {}, b"x" * (5 << 20)))
    assert e.value.status == 413 and e.value.code == "PAYLOAD_TOO_LARGE"
    assert len(attempts) == 1, attempts
    # The connection is usable afterwards.
    assert c.reserve(NS, new_key()).outcome == "ACQUIRED"


def _resetting_server(read: int):
    """A server that reads the request head and `read` bytes of the body,
    then resets the connection without answering."""
    ln = socket.socket()
    ln.bind(("127.0.0.1", 0))
    ln.listen(8)

    def serve():
        while True:
            try:
                conn, _ = ln.accept()
            except OSError:
                return
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            got = len(data.split(b"\r\n\r\n", 1)[-1])
            while got < read:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                got += len(chunk)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return ln


def test_a_reset_while_sending_a_body_over_the_limit_is_payload_too_large():
    ln = _resetting_server(read=1 << 20)
    try:
        url = f"http://127.0.0.1:{ln.getsockname()[1]}"
        c = Client(url, max_retry_after=0.01)
        attempts = _count_attempts(c)
        with pytest.raises(PayloadTooLargeError):
            c.complete(NS, new_key(), "owner-token-0123456789", Response(200, {}, b"x" * (5 << 20)))
        assert len(attempts) == 1
        # Under the limit, a reset is a transport failure: retried, then UNAVAILABLE.
        attempts.clear()
        with pytest.raises(UnavailableError):
            c.complete(NS, new_key(), "owner-token-0123456789", Response(200, {}, b"x" * (1 << 20)))
        assert len(attempts) == c.max_attempts
        # A node run with a larger --max-response-bytes: the caller says so.
        big = Client(url, max_attempts=2, max_retry_after=0.01, max_request_bytes=64 << 20)
        attempts = _count_attempts(big)
        with pytest.raises(UnavailableError):
            big.complete(NS, new_key(), "owner-token-0123456789", Response(200, {}, b"x" * (5 << 20)))
        assert len(attempts) == 2
    finally:
        ln.close()


def test_an_attempt_carrying_megabytes_gets_a_second_per_mib_more():
    # A store that takes 0.8 s to answer any request: longer than the 0.2 s
    # timeout, shorter than what a 3 MiB completion gets on top of it.
    class SlowStore(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(0.8)
            out = json.dumps({"completed_at": "2026-12-05T00:00:00Z", "expires_at": "2026-12-06T00:00:00Z"}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            except OSError:
                pass  # the client gave up on the attempt

    store = ThreadingHTTPServer(("127.0.0.1", 0), SlowStore)
    threading.Thread(target=store.serve_forever, daemon=True).start()
    try:
        c = Client(f"http://127.0.0.1:{store.server_address[1]}", timeout=0.2, max_attempts=1)
        completed_at, _ = c.complete(NS, new_key(), "owner-token-0123456789", Response(200, {}, b"x" * (3 << 20)))
        assert completed_at.year == 2026
        with pytest.raises(UnavailableError):  # a small completion is still cut off at the timeout
            c.complete(NS, new_key(), "owner-token-0123456789", Response(200, {}, b"small"))
    finally:
        store.shutdown()


def test_run_concurrent_duplicates_run_once(client):
    key = new_key()
    runs = []

    def fn(lease):
        runs.append(lease.fencing_token)
        time.sleep(0.3)
        return Response(201, {"X-Run": "1"}, b"charged")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: client.run(NS, key, fn, fingerprint="same", max_wait=20), range(8)))
    assert len(runs) == 1
    assert sum(not r.replayed for r in results) == 1
    assert {(r.response.status, r.response.body) for r in results} == {(201, b"charged")}


def test_run_throw_releases_and_permanent_is_stored(client):
    key = new_key()
    tokens = []

    def flaky(lease):
        tokens.append(lease.fencing_token)
        raise ConnectionError("card network down")

    with pytest.raises(ConnectionError):
        client.run(NS, key, flaky)
    ok = client.run(NS, key, lambda lease: tokens.append(lease.fencing_token) or (200, {}, b"ok"))
    assert not ok.replayed and len(tokens) == 2 and tokens[1] > tokens[0]
    assert client.run(NS, key, flaky).replayed

    bad = new_key()
    with pytest.raises(PermanentError):
        client.run(NS, bad, lambda lease: (_ for _ in ()).throw(PermanentError("negative amount", Response(422, {}, b"bad"))))
    replay = client.run(NS, bad, flaky)
    assert replay.replayed and replay.response.status == 422


def test_run_slow_owner_no_wait_and_waiting_retry(client):
    key = new_key()
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(client.run, NS, key, lambda lease: time.sleep(1.5) or (200, {}, b"slow result"))
        time.sleep(0.3)
        with pytest.raises(InProgressError):
            client.run(NS, key, lambda lease: (500, {}, b""), max_wait=0)
        waited = client.run(NS, key, lambda lease: pytest.fail("must not run"), max_wait=15)
        assert waited.replayed and waited.response.body == b"slow result"
        assert not slow.result().replayed


def test_run_heartbeats_keep_a_short_lease(client):
    key = new_key()
    seen = {}

    def long(lease):
        seen["lease"] = lease
        time.sleep(4.0)  # well over two 1.5 s leases
        return (200, {}, b"long")

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(client.run, NS, key, long, lease_ms=1500)
        for i in range(5):
            time.sleep(0.7)  # without heartbeats the key could be reclaimed from 1.6 s on
            assert client.reserve(NS, key).outcome == "IN_PROGRESS", f"probe {i}"
        assert not fut.result().replayed
    assert not seen["lease"].lost.is_set()


def test_run_lost_lease_is_reported(client):
    key = new_key()

    def fn(lease):
        for _ in range(200):  # bounded: 20 s
            lease.check()
            time.sleep(0.1)
        return (200, {}, b"")

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(client.run, NS, key, fn, lease_ms=600)
        time.sleep(0.3)
        client.force_release(NS, key, "test: take the key away")
        with pytest.raises(LeaseLostError):
            fut.result(30)


def test_run_killed_owner_is_reclaimed(client, node):
    key = new_key()
    proc, line = spawn_until([str(HERE / "owner.py"), "client", node.url, NS, key], "owner ")
    dead = int(line.split()[1])
    proc.kill()
    proc.wait()
    seen = {}
    res = client.run(NS, key, lambda lease: seen.setdefault("lease", lease) and (200, {}, b"redone"), max_wait=15)
    assert not res.replayed
    lease = seen["lease"]
    assert lease.reclaimed and lease.previous_fencing_token == dead and lease.fencing_token > dead


def test_once(client):
    n = []
    eid = f"evt-{new_key()}"
    assert client.once(NS, eid, lambda token, lease: n.append(token)) is True
    assert client.once(NS, eid, lambda token, lease: n.append(token)) is False
    assert len(n) == 1 and isinstance(n[0], int)

    def malformed(token, lease):
        raise PermanentError("malformed event")

    bad = f"evt-{new_key()}"
    with pytest.raises(PermanentError):
        client.once(NS, bad, malformed)
    with pytest.raises(PermanentError, match="malformed event"):
        client.once(NS, bad, lambda token, lease: n.append(token))
    assert len(n) == 1


def test_fingerprint_mismatch(client):
    key = new_key()
    client.run(NS, key, lambda lease: (200, {}, b""), fingerprint="a")
    with pytest.raises(FingerprintMismatchError):
        client.run(NS, key, lambda lease: (200, {}, b""), fingerprint="b")


# -- asyncio ----------------------------------------------------------------

def test_async_calls_run_and_once(node):
    async def main():
        async with AsyncClient(node.url) as c:
            key = new_key()
            r = await c.reserve(NS, key)
            assert r.outcome == "ACQUIRED"
            assert (await c.heartbeat(NS, key, r.owner_token)) is not None
            await c.complete(NS, key, r.owner_token, Response(202, {}, b"async"))
            assert (await c.get(NS, key)).state == "COMPLETED"
            assert (await c.list_keys(NS, limit=1)).keys

            runs = []

            async def fn(lease):
                runs.append(lease.fencing_token)
                await asyncio.sleep(0.3)
                return Response(201, {}, b"once")

            k2 = new_key()
            results = await asyncio.gather(*(c.run(NS, k2, fn, max_wait=20) for _ in range(8)))
            assert len(runs) == 1 and sum(not x.replayed for x in results) == 1
            assert {x.response.body for x in results} == {b"once"}

            async def boom(lease):
                raise RuntimeError("boom")

            k3 = new_key()
            with pytest.raises(RuntimeError):
                await c.run(NS, k3, boom)
            assert not (await c.run(NS, k3, fn)).replayed

            async def handle(token, lease):
                runs.append(token)

            eid = f"evt-{new_key()}"
            assert await c.once(NS, eid, handle) is True
            assert await c.once(NS, eid, handle) is False

    asyncio.run(main())


def test_async_heartbeats_and_lost_lease_cancels_fn(node):
    async def main():
        async with AsyncClient(node.url) as c:
            key = new_key()

            async def long(lease):
                await asyncio.sleep(4.0)  # well over two 1.5 s leases
                return Response(200)

            task = asyncio.ensure_future(c.run(NS, key, long, lease_ms=1500))
            for i in range(5):
                await asyncio.sleep(0.7)
                assert (await c.reserve(NS, key)).outcome == "IN_PROGRESS", f"probe {i}"
            assert not (await task).replayed

            key2 = new_key()
            cancelled = asyncio.Event()

            async def victim(lease):
                try:
                    await asyncio.sleep(20)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
                return Response(200)

            task2 = asyncio.ensure_future(c.run(NS, key2, victim, lease_ms=600))
            await asyncio.sleep(0.3)
            await c.force_release(NS, key2, "test")
            with pytest.raises(LeaseLostError):
                await asyncio.wait_for(task2, 20)
            assert cancelled.is_set()

    asyncio.run(main())


def test_async_killed_owner_is_reclaimed(node):
    key = new_key()
    proc, line = spawn_until([str(HERE / "owner.py"), "client", node.url, NS, key], "owner ")
    dead = int(line.split()[1])
    proc.kill()
    proc.wait()

    async def main():
        async with AsyncClient(node.url) as c:
            seen = {}

            async def fn(lease):
                seen["lease"] = lease
                return Response(200)

            await c.run(NS, key, fn, max_wait=15)
            return seen["lease"]

    lease = asyncio.run(main())
    assert lease.reclaimed and lease.previous_fencing_token == dead
