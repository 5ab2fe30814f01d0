"""A process that takes a key and dies holding it: run() with an fn that never
returns ("client"), or the ASGI middleware around a handler that never
answers ("asgi"). The test kills it with SIGKILL."""

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from idem_client import AsyncClient, Client  # noqa: E402
from idem_client.asgi import IdempotencyMiddleware  # noqa: E402

mode, url, ns, key = sys.argv[1:5]


def forever(lease):
    print(f"owner {lease.fencing_token}", flush=True)
    while True:
        time.sleep(1)


if mode == "client":
    Client(url).run(ns, key, forever, lease_ms=500)
else:
    body = sys.argv[5].encode()

    async def app(scope, receive, send):
        await receive()
        print(f"owner {scope['state']['idempotency'].fencing_token}", flush=True)
        await asyncio.sleep(3600)

    async def main():
        mw = IdempotencyMiddleware(app, AsyncClient(url), lease_ms=500)
        scope = {"type": "http", "method": "POST", "path": "/payments", "raw_path": b"/payments", "query_string": b"",
                 "headers": [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")]}
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)

        async def send(message):
            pass

        await mw(scope, receive, send)

    asyncio.run(main())
