"""A payments API on FastAPI whose POST /payments runs once per
Idempotency-Key, with idem-client's ASGI middleware and a dev node
(go run ./cmd/idemnode --dev). Run from the repository root:

    PYTHONPATH=clients/python /usr/bin/python3 examples/fastapi/app.py

(it serves with uvicorn: apt-get install python3-uvicorn, or pip install
uvicorn). Then see the README's "Use idem from Node.js and Python".
"""

import asyncio
import os

from fastapi import FastAPI, HTTPException, Request

from idem_client import AsyncClient
from idem_client.asgi import IdempotencyMiddleware

idem = AsyncClient(os.environ.get("IDEM_URL", "http://127.0.0.1:8080"))
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, client=idem, require_key=True)
charges = 0


@app.post("/payments", status_code=201)
async def pay(payment: dict, request: Request, slow: bool = False):
    global charges
    if slow:
        await asyncio.sleep(5)  # a slow card network
    if not payment.get("amount", 0) > 0:
        raise HTTPException(422, "amount must be positive")  # final: stored and replayed
    charges += 1
    # Hand the fencing token to your own storage, so a replaced attempt's late writes are refused.
    return {
        "charge_id": f"ch_{charges}",
        "amount": payment["amount"],
        "charges_so_far": charges,
        "fencing_token": str(request.state.idempotency.fencing_token),
    }


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "9100")))
