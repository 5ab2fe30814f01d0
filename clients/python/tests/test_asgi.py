"""The ASGI middleware under Starlette and FastAPI against a real idemnode
--dev, with the proxy's semantics: replay, 409, 422, 400, 401, 413, release on
5xx and exceptions, Prefer: wait, the fencing token, heartbeats and a killed
owner."""

import asyncio
import json
import uuid
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request as FastAPIRequest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from conftest import spawn_until
from idem_client import AsyncClient
from idem_client import Response as Response_
from idem_client.asgi import IdempotencyMiddleware

HERE = Path(__file__).resolve().parent


def new_key() -> str:
    return str(uuid.uuid4())


def starlette_app(idem, handler, **options):
    return Starlette(routes=[Route("/payments", handler, methods=["POST", "GET"])],
                     middleware=[Middleware(IdempotencyMiddleware, client=idem, **options)])


def http(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://app")


def run(coro):
    return asyncio.run(coro)


def problem_of(r, status, slug):
    assert r.status_code == status
    assert r.headers["content-type"] == "application/problem+json"
    p = r.json()
    assert p["status"] == status and p["type"] == f"https://idem.dev/problems/{slug}" and p["title"] and p["detail"]
    return p


def test_first_runs_retry_replays_other_body_422(node):
    async def main():
        calls = []

        async def pay(request):
            info = request.state.idempotency
            calls.append((info, request.headers.get("idempotency-fencing-token")))
            body = await request.json()
            r = JSONResponse({"charge": f"ch_{len(calls)}", "amount": body["amount"], "fencing_token": str(info.fencing_token)}, status_code=201)
            r.headers["X-Charge"] = f"ch_{len(calls)}"
            r.set_cookie("session", "abc")
            return r

        async with AsyncClient(node.url) as idem, http(starlette_app(idem, pay)) as c:
            key = new_key()
            first = await c.post("/payments?currency=eur", json={"amount": 100}, headers={"Idempotency-Key": key, "Idempotency-Fencing-Token": "999999"})
            assert first.status_code == 201 and "idempotent-replayed" not in first.headers
            assert "session=abc" in first.headers["set-cookie"] and first.headers["idempotency-key-expires"]
            info, token_header = calls[0]
            assert token_header == str(info.fencing_token) != "999999"
            again = await c.post("/payments?currency=eur", json={"amount": 100}, headers={"Idempotency-Key": key})
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.headers["x-charge"] == "ch_1" and "set-cookie" not in again.headers
            assert again.headers["content-type"] == first.headers["content-type"]
            assert again.content == first.content
            problem_of(await c.post("/payments?currency=eur", json={"amount": 200}, headers={"Idempotency-Key": key}), 422, "idempotency-key-reused")
            problem_of(await c.post("/payments?currency=usd", json={"amount": 100}, headers={"Idempotency-Key": key}), 422, "idempotency-key-reused")
            assert len(calls) == 1

    run(main())


def test_concurrent_duplicates_409_or_wait(node):
    async def main():
        runs = []

        async def pay(request):
            runs.append(1)
            await asyncio.sleep(0.6)
            return JSONResponse({"run": len(runs)}, status_code=201)

        async with AsyncClient(node.url) as idem, http(starlette_app(idem, pay)) as c:
            key = new_key()
            answers = await asyncio.gather(*(c.post("/payments", json={"a": 1}, headers={"Idempotency-Key": key}) for _ in range(6)))
            assert len(runs) == 1
            assert sorted(a.status_code for a in answers) == [201, 409, 409, 409, 409, 409]
            for a in answers:
                if a.status_code == 409:
                    problem_of(a, 409, "request-in-progress")
                    assert int(a.headers["retry-after"]) >= 1
            key2 = new_key()
            waited = await asyncio.gather(*(c.post("/payments", json={"a": 1}, headers={"Idempotency-Key": key2, "Prefer": "wait=10"}) for _ in range(6)))
            assert len(runs) == 2
            assert [w.status_code for w in waited] == [201] * 6
            assert sum(w.headers.get("idempotent-replayed") == "true" for w in waited) == 5
            assert len({w.content for w in waited}) == 1

    run(main())


def test_exception_and_5xx_release_the_key(node):
    async def main():
        n = []

        async def pay(request):
            n.append(1)
            if len(n) == 1:
                raise RuntimeError("card network down")
            if len(n) == 2:
                return PlainTextResponse("try later", status_code=503)
            if len(n) == 3:
                return Response(status_code=429)
            return JSONResponse({"ok": len(n)}, status_code=201)

        async with AsyncClient(node.url) as idem, http(starlette_app(idem, pay)) as c:
            key = new_key()
            h = {"Idempotency-Key": key}
            assert (await c.post("/payments", json={"a": 1}, headers=h)).status_code == 500
            assert (await c.post("/payments", json={"a": 1}, headers=h)).status_code == 503
            assert (await c.post("/payments", json={"a": 1}, headers=h)).status_code == 429
            ok = await c.post("/payments", json={"a": 1}, headers=h)
            assert ok.status_code == 201 and ok.json() == {"ok": 4}
            assert (await c.post("/payments", json={"a": 1}, headers=h)).headers["idempotent-replayed"] == "true"
            assert len(n) == 4

    run(main())


def test_streaming_and_empty_responses_replay_exactly(node):
    async def main():
        async def stream(request):
            async def gen():
                yield b"a,b\n"
                yield b"1,2\n"
            return StreamingResponse(gen(), media_type="text/csv")

        async def empty(request):
            return Response(status_code=204)

        app = Starlette(routes=[Route("/stream", stream, methods=["POST"]), Route("/empty", empty, methods=["POST"])],
                        middleware=[Middleware(IdempotencyMiddleware, client=idem)])
        async with http(app) as c:
            for path in ("/stream", "/empty"):
                key = new_key()
                a = await c.post(path, content=b"x", headers={"Idempotency-Key": key})
                b = await c.post(path, content=b"x", headers={"Idempotency-Key": key})
                assert b.headers["idempotent-replayed"] == "true", path
                assert (b.status_code, b.headers.get("content-type"), b.content) == (a.status_code, a.headers.get("content-type"), a.content), path
            assert a.status_code == 204

    idem = AsyncClient(node.url)
    run(main())


def test_replay_leaves_out_per_response_headers(node):
    # A replay is a new message: the server dates and frames it. Date,
    # Content-Length, Transfer-Encoding and Connection (and what it names)
    # are not stored, and not replayed from a record that holds them.
    stale = "Mon, 01 Jan 2001 00:00:00 GMT"

    async def main():
        async def pay(request):
            return PlainTextResponse("ok", status_code=201, headers={"Date": stale, "X-Kept": "kept"})

        app = starlette_app(idem, pay)
        key = new_key()
        async with http(app) as c:
            first = await c.post("/payments", content=b"x", headers={"Idempotency-Key": key})
            assert first.status_code == 201
            rec = await idem.get("default", key)
            assert "Date" not in rec.response.headers and rec.response.headers.get("X-Kept") == "kept"
            # The same request's record, completed through the JSON API
            # with the per-response headers in it.
            await idem.delete_key("default", key, "test")
            res = await idem.reserve("default", key, fingerprint=rec.fingerprint)
            await idem.complete("default", key, res.owner_token, Response_(201, {
                "Date": stale, "Content-Length": "999", "Transfer-Encoding": "chunked", "Connection": "X-Hop",
                "X-Hop": "1", "X-Kept": "kept"}, b"ok"))
            again = await c.post("/payments", content=b"x", headers={"Idempotency-Key": key})
        assert again.headers["idempotent-replayed"] == "true" and again.content == b"ok"
        assert again.headers.get("x-kept") == "kept"
        names = [k.lower() for k, _ in again.headers.raw]
        for gone in (b"date", b"transfer-encoding", b"connection", b"x-hop"):
            assert gone not in names, (gone, again.headers.raw)
        assert again.headers.get_list("content-length") == ["2"]

    idem = AsyncClient(node.url)
    run(main())


def test_passthrough_and_problems(node):
    async def main():
        calls = []

        async def pay(request):
            calls.append(request.state.idempotency.namespace if hasattr(request.state, "idempotency") else None)
            return JSONResponse({"n": len(calls)}, status_code=201)

        async with AsyncClient(node.url) as idem:
            async with http(starlette_app(idem, pay)) as c:
                assert (await c.post("/payments", json={})).status_code == 201
                assert (await c.post("/payments", json={})).status_code == 201
                assert calls == [None, None]
                problem_of(await c.post("/payments", json={}, headers={"Idempotency-Key": "has space"}), 400, "invalid-idempotency-key")
                quoted = new_key()
                assert (await c.post("/payments", json={}, headers={"Idempotency-Key": f'"{quoted}"'})).status_code == 201
                assert (await c.post("/payments", json={}, headers={"Idempotency-Key": quoted})).headers["idempotent-replayed"] == "true"
            calls.clear()
            strict = starlette_app(idem, pay, require_key=True, namespace_header="X-Tenant", max_request_bytes=64)
            async with http(strict) as c:
                problem_of(await c.post("/payments", json={}), 400, "missing-idempotency-key")
                r = await c.post("/payments", json={}, headers={"Idempotency-Key": new_key()})
                problem_of(r, 401, "missing-caller-identity")
                assert "X-Tenant" in r.headers["www-authenticate"]
                problem_of(await c.post("/payments", json={}, headers={"Idempotency-Key": new_key(), "X-Tenant": "Not Valid"}), 400, "invalid-namespace")
                problem_of(await c.post("/payments", json={"a": "x" * 100}, headers={"Idempotency-Key": new_key(), "X-Tenant": "acme"}), 413, "request-too-large")
                assert calls == []
                key = new_key()
                a = await c.post("/payments", json={}, headers={"Idempotency-Key": key, "X-Tenant": "acme"})
                g = await c.post("/payments", json={}, headers={"Idempotency-Key": key, "X-Tenant": "globex"})
                assert a.status_code == g.status_code == 201 and "idempotent-replayed" not in g.headers
                assert calls == ["acme", "globex"]

    run(main())


def test_large_body_streams_and_replay_is_marked_omitted(node):
    async def main():
        big = b"x" * 5000

        async def pay(request):
            return Response(big, media_type="text/plain")

        async with AsyncClient(node.url) as idem, http(starlette_app(idem, pay, max_stored_body_bytes=1024)) as c:
            key = new_key()
            a = await c.post("/payments", content=b"1", headers={"Idempotency-Key": key})
            assert a.content == big
            # The first caller may hold the whole body before the key is
            # completed (it streamed): the retry waits for the completion.
            b = await c.post("/payments", content=b"1", headers={"Idempotency-Key": key, "Prefer": "wait=10"})
            assert b.status_code == 200 and b.headers["idempotent-body-omitted"] == "true" and b.content == b""

    run(main())


def test_heartbeats_keep_a_long_handlers_short_lease(node):
    async def main():
        runs = []

        async def pay(request):
            runs.append(request.state.idempotency)
            await asyncio.sleep(4.0)  # well over two 1.5 s leases
            return JSONResponse({"done": True}, status_code=201)

        async with AsyncClient(node.url) as idem, http(starlette_app(idem, pay, lease_ms=1500)) as c:
            key = new_key()
            first = asyncio.ensure_future(c.post("/payments", json={"a": 1}, headers={"Idempotency-Key": key}))
            for i in range(5):
                await asyncio.sleep(0.7)  # without heartbeats the key could be reclaimed from 1.6 s on
                assert (await c.post("/payments", json={"a": 1}, headers={"Idempotency-Key": key})).status_code == 409, f"probe {i}"
            assert (await first).status_code == 201
            assert len(runs) == 1 and not runs[0].lost.is_set()

    run(main())


def test_killed_owner_is_reclaimed(node):
    key = new_key()
    body = json.dumps({"amount": 5})
    proc, line = spawn_until([str(HERE / "owner.py"), "asgi", node.url, "default", key, body], "owner ")
    dead = int(line.split()[1])
    proc.kill()
    proc.wait()

    async def main():
        seen = []

        async def pay(request):
            seen.append(request.state.idempotency)
            return JSONResponse({"ok": True}, status_code=201)

        async with AsyncClient(node.url) as idem, http(starlette_app(idem, pay)) as c:
            r = await c.post("/payments", content=body.encode(), headers={"Idempotency-Key": key, "Content-Type": "application/json", "Prefer": "wait=10"})
            assert r.status_code == 201
        return seen

    seen = run(main())
    assert len(seen) == 1 and seen[0].reclaimed and seen[0].previous_fencing_token == dead and seen[0].fencing_token > dead


def test_fastapi(node):
    async def main():
        async with AsyncClient(node.url) as idem:
            app = FastAPI()
            app.add_middleware(IdempotencyMiddleware, client=idem, require_key=True)
            charges = []

            @app.post("/payments", status_code=201)
            async def pay(payment: dict, request: FastAPIRequest):
                charges.append(payment)
                return {"charge_id": f"ch_{len(charges)}", "fencing_token": str(request.state.idempotency.fencing_token)}

            async with http(app) as c:
                key = new_key()
                a = await c.post("/payments", json={"amount": 100}, headers={"Idempotency-Key": key})
                b = await c.post("/payments", json={"amount": 100}, headers={"Idempotency-Key": key})
                assert a.status_code == b.status_code == 201
                assert b.headers["idempotent-replayed"] == "true" and a.json() == b.json()
                assert len(charges) == 1
                problem_of(await c.post("/payments", json={"amount": 100}), 400, "missing-idempotency-key")

    run(main())
