"""The asyncio client: the same calls, run() and once() as Client, on the same
code (_core); each HTTP attempt runs on a thread of the client's own pool, and
waits, heartbeats and fn run on the event loop."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Awaitable, Callable, Dict, List, Optional

from . import _core
from ._core import (KeyPage, Policy, Record, Reservation, Response, RunResult, as_response, batch_complete_body, batch_reserve_body,
                    batch_results, key_path, list_path, new_owner_token, ns_path, reserve_body, retry_wait)
from .client import ONCE_DONE, ONCE_FAILED, Lease, _decide, _once_result
from .errors import (IdemError, InProgressError, InvalidArgumentError, LeaseLostError, NotFoundError, NotOwnerError,
                     PayloadTooLargeError, PermanentError)

log = logging.getLogger("idem_client")


class AsyncClient:
    """The asyncio form of Client (same arguments, plus ``max_concurrency``:
    the HTTP attempts in flight at once, each on a thread of the client's
    pool). Close it with ``await client.aclose()`` or ``async with``."""

    def __init__(self, base_url: str, token: Optional[str] = None, ssl_context: Optional[ssl.SSLContext] = None,
                 timeout: float = _core.DEFAULT_TIMEOUT, max_attempts: int = _core.DEFAULT_MAX_ATTEMPTS,
                 max_retry_after: float = _core.DEFAULT_MAX_RETRY_AFTER, max_concurrency: int = 64,
                 max_request_bytes: int = _core.DEFAULT_MAX_REQUEST_BYTES):
        self.base_url = base_url
        self.max_attempts = max_attempts
        self.max_retry_after = max_retry_after
        self.transport = _core.Transport(base_url, timeout, ssl_context, token, max_request_bytes)
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="idem-http")

    async def aclose(self) -> None:
        self.pool.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _attempt(self, method: str, path: str, body: Optional[Dict[str, Any]], extra_timeout: float = 0.0,
                       timeout: Optional[float] = None):
        loop = asyncio.get_running_loop()
        # The executor's thread does not see this task's context: take the
        # caller's trace context here.
        trace = _core.trace_headers()
        answer = await loop.run_in_executor(self.pool, lambda: self.transport.attempt(method, path, body, extra_timeout, timeout, trace))
        return answer.decode(method, path)

    async def call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, retry: bool = True,
                   extra_timeout: float = 0.0) -> Dict[str, Any]:
        attempts = self.max_attempts if retry else 1
        last: Optional[IdemError] = None
        for attempt in range(1, attempts + 1):
            try:
                parsed, err = await self._attempt(method, path, body, extra_timeout)
            except IdemError as e:
                parsed, err = None, e
            if err is None:
                return parsed  # type: ignore[return-value]
            last = err
            wait = retry_wait(err, attempt, self.max_retry_after)
            if wait is None or attempt == attempts:
                break
            await asyncio.sleep(wait)
        assert last is not None
        raise last

    async def reserve(self, ns: str, key: str, fingerprint: Optional[str] = None, lease_ms: Optional[int] = None,
                      owner_token: Optional[str] = None, wait_ms: Optional[int] = None, if_expired: Optional[str] = None) -> Reservation:
        body = reserve_body(fingerprint, lease_ms, owner_token, wait_ms, if_expired)
        return Reservation.from_json(await self.call("POST", key_path(ns, key) + ":reserve", body, extra_timeout=(wait_ms or 0) / 1000))

    async def heartbeat(self, ns: str, key: str, owner_token: str, lease_ms: Optional[int] = None):
        body: Dict[str, Any] = {"owner_token": owner_token}
        if lease_ms:
            body["lease_ms"] = int(lease_ms)
        return _core._time((await self.call("POST", key_path(ns, key) + ":heartbeat", body)).get("lease_expires_at"))

    async def complete(self, ns: str, key: str, owner_token: str, response: Any, retention_s: Optional[int] = None):
        body: Dict[str, Any] = {"owner_token": owner_token, "response": as_response(response).to_json()}
        if retention_s:
            body["retention_s"] = int(retention_s)
        a = await self.call("POST", key_path(ns, key) + ":complete", body)
        return _core._time(a.get("completed_at")), _core._time(a.get("expires_at"))

    async def release(self, ns: str, key: str, owner_token: str) -> None:
        await self.call("POST", key_path(ns, key) + ":release", {"owner_token": owner_token})

    async def get(self, ns: str, key: str) -> Optional[Record]:
        try:
            return Record.from_json(await self.call("GET", key_path(ns, key)))
        except NotFoundError:
            return None

    async def list_keys(self, ns: str, state: Optional[str] = None, older_than_s: Optional[int] = None,
                        limit: Optional[int] = None, page_token: Optional[str] = None) -> KeyPage:
        return KeyPage.from_json(await self.call("GET", list_path(ns, state, older_than_s, limit, page_token)))

    async def force_release(self, ns: str, key: str, reason: str) -> Optional[int]:
        return _core._token((await self.call("POST", key_path(ns, key) + ":force-release", {"reason": reason})).get("previous_fencing_token"))

    async def delete_key(self, ns: str, key: str, reason: str) -> None:
        await self.call("DELETE", key_path(ns, key), {"reason": reason})

    # -- v1.2 -----------------------------------------------------------

    async def batch_reserve(self, ns: str, items: List[Dict[str, Any]]) -> List[Any]:
        """Reserves up to 1000 keys in one call (v1.2). items: dicts with key,
        fingerprint, owner_token, lease_ms. Per item, in order, a Reservation
        or a BatchError."""
        return batch_results(await self.call("POST", ns_path(ns, "keys:batch-reserve"), batch_reserve_body(items)), Reservation.from_json)

    async def batch_complete(self, ns: str, items: List[Dict[str, Any]]) -> List[Any]:
        """Completes up to 1000 keys in one call (v1.2). items: dicts with key,
        owner_token, response, retention_s. Per item (completed_at,
        expires_at) or a BatchError."""
        return batch_results(await self.call("POST", ns_path(ns, "keys:batch-complete"), batch_complete_body(items)),
                             lambda r: (_core._time(r.get("completed_at")), _core._time(r.get("expires_at"))))

    async def checkpoint(self, ns: str, key: str, owner_token: str, name: str, data: Any) -> Optional[datetime]:
        """Records a recovery point of the running attempt (v1.2); a RECLAIMED
        answer carries the last one. Returns checkpointed_at."""
        body = {"owner_token": owner_token, "name": name, "data": _core.encode_body(data)}
        return _core._time((await self.call("POST", key_path(ns, key) + ":checkpoint", body)).get("checkpointed_at"))

    async def get_policy(self, ns: str) -> Policy:
        """The namespace's policy in force (v1.2)."""
        return Policy.from_json(await self.call("GET", ns_path(ns, "policy")))

    async def set_policy(self, ns: str, policy: Policy) -> Policy:
        """Sets the namespace's policy (v1.2, admin); None fields keep the built-in defaults."""
        return Policy.from_json(await self.call("PUT", ns_path(ns, "policy"), policy.to_json()))

    async def run(self, ns: str, key: str, fn: Callable[[Lease], Awaitable[Any]], fingerprint: Optional[str] = None,
                  lease_ms: int = _core.DEFAULT_LEASE_MS, retention_s: Optional[int] = None,
                  max_wait: float = _core.DEFAULT_MAX_WAIT, if_expired: Optional[str] = None) -> RunResult:
        """Client.run for coroutines: ``await fn(lease)`` runs as a task that is
        cancelled (and ``lease.lost`` set) when the lease is lost; run then
        raises LeaseLostError."""
        token = new_owner_token()
        wait_until = time.monotonic() + max_wait
        poll = 0.02
        store_wait = 0
        while True:
            sent_at = time.monotonic()
            res = await self.reserve(ns, key, fingerprint=fingerprint, lease_ms=lease_ms, owner_token=token, wait_ms=store_wait,
                                     if_expired=if_expired)
            decided = _decide(ns, key, res, max_wait)
            if decided is not None:
                return decided
            if res.outcome in ("ACQUIRED", "RECLAIMED"):
                return await self.run_owned(ns, key, res, sent_at, fn, lease_ms, retention_s)
            remaining = wait_until - time.monotonic()
            if remaining < 0.001:
                raise InProgressError(f"idem: {ns}/{key} is held by another owner whose lease ends at {res.lease_expires_at}; waited {max_wait}s",
                                      res.lease_expires_at)
            asked = store_wait
            store_wait = min(int(remaining * 1000), _core.STORE_MAX_WAIT_MS)
            if asked == 0 or time.monotonic() - sent_at >= asked / 2000:
                continue
            wait = min(poll, remaining, res.retry_after or poll)
            poll = min(2 * poll, 1.0)
            await asyncio.sleep(wait / 2 + random.random() * wait / 2)

    async def run_owned(self, ns: str, key: str, res: Reservation, sent_at: float, fn: Callable[[Lease], Awaitable[Any]],
                        lease_ms: int, retention_s: Optional[int], heartbeat_s: Optional[float] = None) -> RunResult:
        """Runs fn holding a reservation already made (also the ASGI middleware's path)."""
        lease = Lease(res.fencing_token or 0, res.outcome == "RECLAIMED", res.previous_fencing_token, res.owner_token or "",
                      res.lease_expires_at, res.checkpoint, asyncio.Event(),
                      lambda name, data: self.checkpoint(ns, key, res.owner_token or "", name, data))
        work = asyncio.ensure_future(fn(lease))
        hb = asyncio.ensure_future(self.keep_lease(ns, key, lease, lease_ms, sent_at + lease_ms / 1000, work, heartbeat_s))
        try:
            out = await asyncio.shield(work)
        except asyncio.CancelledError:
            if not work.cancelled() or not lease.lost.is_set():
                # The caller was cancelled: free the key and go on cancelling.
                work.cancel()
                hb.cancel()
                await self._release(ns, key, lease.owner_token)
                raise
            hb.cancel()
            await self._release(ns, key, lease.owner_token)
            raise LeaseLostError(f"idem: {ns}/{key}: the lease was lost while fn ran; fn was cancelled") from None
        except PermanentError as e:
            hb.cancel()
            await self._finish(ns, key, lease, e.response, retention_s)
            raise
        except BaseException as e:
            hb.cancel()
            await self._release(ns, key, lease.owner_token)
            if lease.lost.is_set() and isinstance(e, Exception):
                raise LeaseLostError(f"idem: {ns}/{key}: the lease was lost while fn ran: {e}") from e
            raise
        hb.cancel()
        response = as_response(out)
        completed_at, expires_at = await self._finish(ns, key, lease, response, retention_s)
        return RunResult(response, False, lease.fencing_token, completed_at, expires_at)

    async def _release(self, ns: str, key: str, owner_token: str) -> None:
        try:
            await self.release(ns, key, owner_token)
        except NotOwnerError:
            pass
        except IdemError as e:
            log.warning("idem: release of %s/%s failed; the key stays reserved until its lease runs out: %s", ns, key, e)

    async def _finish(self, ns: str, key: str, lease: Lease, response: Any, retention_s: Optional[int]):
        try:
            return await self.complete(ns, key, lease.owner_token, response, retention_s)
        except NotOwnerError as e:
            raise LeaseLostError(f"idem: {ns}/{key}: another owner took the key while fn ran; its work may be repeated") from e
        except (InvalidArgumentError, PayloadTooLargeError) as e:
            await self._release(ns, key, lease.owner_token)
            raise type(e)(e.code, f"idem: {ns}/{key}: fn's response cannot be stored, so the key was released: {e}", e.status) from e
        except IdemError as e:
            raise type(e)(e.code, f"idem: {ns}/{key}: fn finished but completing failed; the key stays reserved until its lease runs out "
                                  f"and the next owner reclaims it: {e}", e.status, e.retry_after) from e

    async def keep_lease(self, ns: str, key: str, lease: Lease, lease_ms: int, local_end: float, work: "asyncio.Future[Any]",
                         heartbeat_s: Optional[float] = None) -> None:
        """Renews the lease every third of it (or heartbeat_s) until cancelled;
        on loss sets lease.lost and cancels work."""
        interval = heartbeat_s or lease_ms / 3000
        wait = interval
        path = key_path(ns, key) + ":heartbeat"
        while True:
            await asyncio.sleep(wait)
            sent = time.monotonic()
            try:
                _, err = await self._attempt("POST", path, {"owner_token": lease.owner_token, "lease_ms": lease_ms},
                                             timeout=max(min(local_end - sent, self.transport.timeout), 0.001))
            except IdemError as e:
                err = e
            if err is None:
                local_end = sent + lease_ms / 1000
                wait = interval
                continue
            if isinstance(err, NotOwnerError) or time.monotonic() >= local_end:
                log.warning("idem: lease of %s/%s lost: %s", ns, key, err)
                lease.lost.set()
                work.cancel()
                return
            log.warning("idem: heartbeat of %s/%s failed; retrying: %s", ns, key, err)
            wait = max(min(interval / 4, local_end - time.monotonic()), 0.001)

    async def once(self, ns: str, event_id: str, fn: Callable[[int, Lease], Awaitable[Any]], **kwargs: Any) -> bool:
        """Client.once for coroutines."""
        ran = False

        async def body(lease: Lease) -> Response:
            nonlocal ran
            ran = True
            try:
                await fn(lease.fencing_token, lease)
            except PermanentError as e:
                raise PermanentError(str(e), Response(ONCE_FAILED, {}, str(e).encode()[:4096])) from e
            return Response(ONCE_DONE)

        res = await self.run(ns, event_id, body, **kwargs)
        return _once_result(ns, event_id, ran, res)
