"""Load command: reserve + complete cycles through idem-client against a
running node, printing cycles/s and latency percentiles.

    python3 bench/cycles.py [--url http://127.0.0.1:8080] [--concurrency 16] [--seconds 10] [--mode sync|async]

sync: Client on --concurrency threads; async: AsyncClient with
--concurrency tasks. Each cycle is a reserve then a complete.
"""

import argparse
import asyncio
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from idem_client import AsyncClient, Client, IdemError, Response  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--concurrency", type=int, default=16, choices=range(1, 1025), metavar="1..1024")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--mode", default="sync", choices=["sync", "async"])
    a = p.parse_args()
    if not 0 < a.seconds <= 600:
        p.error("--seconds 0..600")
    ns = f"bench-py-{int(time.time() * 1000)}"
    latencies = []
    errors = [0]
    end = time.monotonic() + a.seconds
    started = time.monotonic()
    if a.mode == "sync":
        c = Client(a.url)
        lock = threading.Lock()

        def worker() -> None:
            while time.monotonic() < end:
                key = str(uuid.uuid4())
                t0 = time.perf_counter()
                try:
                    r = c.reserve(ns, key)
                    c.complete(ns, key, r.owner_token, Response(200, {}, b"ok"))
                    with lock:
                        latencies.append((time.perf_counter() - t0) * 1000)
                except IdemError:
                    with lock:
                        errors[0] += 1

        threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        async def run() -> None:
            async with AsyncClient(a.url, max_concurrency=a.concurrency) as c:
                async def worker() -> None:
                    while time.monotonic() < end:
                        key = str(uuid.uuid4())
                        t0 = time.perf_counter()
                        try:
                            r = await c.reserve(ns, key)
                            await c.complete(ns, key, r.owner_token, Response(200, {}, b"ok"))
                            latencies.append((time.perf_counter() - t0) * 1000)
                        except IdemError:
                            errors[0] += 1

                await asyncio.gather(*(worker() for _ in range(a.concurrency)))

        asyncio.run(run())
    elapsed = time.monotonic() - started
    latencies.sort()

    def pct(q: float) -> str:
        return f"{latencies[min(len(latencies) - 1, int(q * len(latencies)))]:.2f}" if latencies else "n/a"

    print(f"mode={a.mode} concurrency={a.concurrency} seconds={elapsed:.1f} cycles={len(latencies)} errors={errors[0]}")
    print(f"cycles/s={len(latencies) / elapsed:.0f} p50={pct(0.5)}ms p99={pct(0.99)}ms max={pct(1)}ms")


if __name__ == "__main__":
    main()
