"""The v1.2 calls (batch reserve/complete, checkpoints, namespace policies,
tombstones and 410) against a real idemnode --dev. Each test first asks the
node whether it serves that call (a v1.1 node answers its path 404
NOT_FOUND, "unknown path") and is skipped, saying so, when it does not."""

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from idem_client import (AsyncClient, BatchError, Client, ExpiredError, InvalidArgumentError, NotOwnerError, Policy,
                         Response)
from idem_client.asgi import IdempotencyMiddleware

NS = "py-v12"


def new_key() -> str:
    return str(uuid.uuid4())


def serves(node, method, path, body=None) -> bool:
    req = urllib.request.Request(node.url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5):
            return True
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        return not (e.code == 404 and ("unknown path" in text or "unknown verb" in text))


def need(node, feature, method, path, body=None):
    if not serves(node, method, path, body):
        pytest.skip(f"this idemnode does not serve the v1.2 {feature} calls")


def test_batch_reserve_and_complete(node):
    need(node, "batch", "POST", "/v1/namespaces/probe/keys:batch-reserve", {"items": []})
    c = Client(node.url)
    a, b = new_key(), new_key()
    held = c.reserve(NS, b)
    res = c.batch_reserve(NS, [{"key": a, "fingerprint": "f"}, {"key": b}, {"key": ""}])
    assert [getattr(r, "outcome", None) for r in res[:2]] == ["ACQUIRED", "IN_PROGRESS"]
    assert isinstance(res[2], BatchError)
    done = c.batch_complete(NS, [
        {"key": a, "owner_token": res[0].owner_token, "response": Response(201, {}, b"a")},
        {"key": b, "owner_token": "y" * 22, "response": Response(200)},
        {"key": b, "owner_token": held.owner_token, "response": Response(202, {}, b"b")},
    ])
    assert done[0][1] is not None
    assert isinstance(done[1], BatchError) and isinstance(done[1].error, NotOwnerError)
    assert done[2][0] is not None
    replay = c.batch_reserve(NS, [{"key": a, "fingerprint": "f"}, {"key": b}])
    assert [r.outcome for r in replay] == ["COMPLETED", "COMPLETED"] and replay[1].response.body == b"b"
    with pytest.raises(InvalidArgumentError):
        c.batch_reserve(NS, [])

    async def main():
        async with AsyncClient(node.url) as ac:
            r = await ac.batch_reserve(NS, [{"key": new_key()}])
            assert r[0].outcome == "ACQUIRED"

    asyncio.run(main())


def test_checkpoint_resumes_a_reclaimed_attempt(node):
    need(node, "checkpoint", "POST", "/v1/namespaces/probe/keys/probe:checkpoint", {"owner_token": "x" * 22, "name": "n", "data": ""})
    c = Client(node.url)
    key = new_key()
    first = c.reserve(NS, key, lease_ms=300)
    assert c.checkpoint(NS, key, first.owner_token, "charged", b"ch_1") is not None
    assert c.get(NS, key).checkpoint.name == "charged"
    with pytest.raises(NotOwnerError):
        c.checkpoint(NS, key, "z" * 22, "x", b"")
    time.sleep(0.6)  # the lease (300 ms) and the dev node's skew margin (100 ms) pass
    seen = {}
    c.run(NS, key, lambda lease: seen.setdefault("lease", lease) and Response(200), max_wait=5)
    lease = seen["lease"]
    assert lease.reclaimed and lease.checkpoint.name == "charged" and lease.checkpoint.data == b"ch_1"
    assert lease.checkpoint.fencing_token == first.fencing_token


def test_policies_tombstones_and_410(node):
    need(node, "policy", "GET", "/v1/namespaces/probe/policy")
    c = Client(node.url)
    ns = f"py-policy-{int(time.time() * 1000)}"
    assert c.set_policy(ns, Policy(tombstone_s=60, max_retention_s=3600)).tombstone_s == 60
    assert c.get_policy(ns).max_retention_s == 3600
    over = new_key()
    held = c.reserve(ns, over)
    with pytest.raises(InvalidArgumentError):
        c.complete(ns, over, held.owner_token, Response(200), retention_s=7200)

    key = new_key()
    c.run(ns, key, lambda lease: Response(200, {}, b"once"), retention_s=1)
    expired = None
    for _ in range(100):  # bounded: 10 s
        r = c.reserve(ns, key)
        if r.outcome == "EXPIRED":
            expired = r
            break
        time.sleep(0.1)
    assert expired is not None and expired.expired_at is not None
    assert c.get(ns, key).state == "EXPIRED"
    with pytest.raises(ExpiredError):
        c.run(ns, key, lambda lease: Response(200))
    again = c.run(ns, key, lambda lease: Response(200, {}, b"twice"), if_expired="acquire")
    assert not again.replayed and again.fencing_token > expired.fencing_token

    async def main():
        runs = []

        async def pay(request):
            runs.append(1)
            return PlainTextResponse("ok", status_code=201)

        async with AsyncClient(node.url) as idem:
            app = Starlette(routes=[Route("/p", pay, methods=["POST"])],
                            middleware=[Middleware(IdempotencyMiddleware, client=idem, namespace=lambda scope: ns, retention_s=1)])
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as h:
                k = new_key()
                assert (await h.post("/p", content=b"x", headers={"Idempotency-Key": k})).status_code == 201
                gone = None
                for _ in range(100):
                    r = await h.post("/p", content=b"x", headers={"Idempotency-Key": k})
                    if r.status_code == 410:
                        gone = r
                        break
                    await asyncio.sleep(0.1)
                assert gone is not None and gone.headers["content-type"] == "application/problem+json"
                assert len(runs) == 1

    asyncio.run(main())
