"""examples/fastapi's app against a dev node (in-process, as uvicorn would
serve it): a retry replays, another body is 422, a keyless POST is 400."""

import asyncio
import importlib.util
import os
from pathlib import Path

import httpx

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fastapi" / "app.py"


def test_fastapi_example_charges_once_per_key(node, monkeypatch):
    monkeypatch.setitem(os.environ, "IDEM_URL", node.url)
    spec = importlib.util.spec_from_file_location("fastapi_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mod.app), base_url="http://app") as c:
            h = {"Idempotency-Key": "order-1001"}
            first = await c.post("/payments", json={"amount": 100}, headers=h)
            assert first.status_code == 201 and first.json()["charge_id"] == "ch_1"
            again = await c.post("/payments", json={"amount": 100}, headers=h)
            assert again.headers["idempotent-replayed"] == "true" and again.json() == first.json()
            assert (await c.post("/payments", json={"amount": 999}, headers=h)).status_code == 422
            assert (await c.post("/payments", json={"amount": 1})).status_code == 400
            bad = {"Idempotency-Key": "order-1002"}
            assert (await c.post("/payments", json={"amount": -1}, headers=bad)).status_code == 422
            assert (await c.post("/payments", json={"amount": -1}, headers=bad)).headers["idempotent-replayed"] == "true"
        await mod.idem.aclose()

    asyncio.run(main())
