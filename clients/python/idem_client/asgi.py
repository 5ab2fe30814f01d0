"""ASGI middleware with the semantics of idem's proxy mode (works under
Starlette and FastAPI: ``app.add_middleware(IdempotencyMiddleware,
client=AsyncClient(...))``)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import format_datetime
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ._core import Response
from ._http import (HEADER_BODY_OMITTED, HEADER_KEY, HEADER_KEY_EXPIRES, HEADER_REPLAYED, Problem, body_allowed,
                    canonical_header, default_release_status, fingerprint, header_lines, namespace_from_authorization,
                    parse_key, parse_prefer_wait, replayed_headers, stored_headers, valid_namespace)
from ._core import new_owner_token
from .aio import AsyncClient
from .client import Lease
from .errors import IdemError, InvalidArgumentError, NotOwnerError, PayloadTooLargeError

log = logging.getLogger("idem_client")

Scope = Dict[str, Any]
Headers = List[Tuple[bytes, bytes]]


@dataclass
class Idempotency:
    """What a handler behind the middleware knows of its reservation:
    ``request.state.idempotency`` (Starlette, FastAPI) or
    ``scope["state"]["idempotency"]``."""

    key: str
    namespace: str
    fencing_token: int
    reclaimed: bool
    previous_fencing_token: Optional[int]
    expires_at: Optional[datetime]
    #: asyncio.Event set when the lease is lost (another request may run the key).
    lost: asyncio.Event = field(default_factory=asyncio.Event)


def _is_fencing_header(name: bytes) -> bool:
    return name.lower().replace(b"_", b"-") == b"idempotency-fencing-token"


class _Capture:
    """Holds the response the app sends until the key is completed or
    released; a body over ``limit`` starts streaming and is stored without it."""

    def __init__(self, send: Callable[[Dict[str, Any]], Awaitable[None]], limit: int):
        self.send = send
        self.limit = limit
        self.status = 0
        self.headers: Headers = []
        self.chunks: List[bytes] = []
        self.size = 0
        self.overflow = False
        self.started = False
        self.done = False

    async def __call__(self, message: Dict[str, Any]) -> None:
        t = message["type"]
        if t == "http.response.start":
            self.started = True
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            return
        if t != "http.response.body":
            await self.send(message)
            return
        body = message.get("body", b"")
        if self.overflow:
            await self.send(message)
        elif body:
            self.chunks.append(bytes(body))
            self.size += len(body)
            if self.size > self.limit:
                self.overflow = True
                await self.send({"type": "http.response.start", "status": self.status, "headers": self.headers})
                await self.send({"type": "http.response.body", "body": b"".join(self.chunks), "more_body": True})
                self.chunks = []
        if not message.get("more_body", False):
            self.done = True

    def body(self) -> bytes:
        return b"".join(self.chunks)

    async def deliver(self, extra: Headers) -> None:
        if self.overflow:
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await self.send({"type": "http.response.start", "status": self.status, "headers": self.headers + extra})
        await self.send({"type": "http.response.body", "body": self.body(), "more_body": False})


async def _send_problem(send: Callable[[Dict[str, Any]], Awaitable[None]], p: Problem) -> None:
    body = p.body()
    await send({"type": "http.response.start", "status": p.status, "headers": p.response_headers() + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class IdempotencyMiddleware:
    """Makes keyed POST and PATCH requests of an ASGI app idempotent over an
    AsyncClient, with the semantics of ``idemrouter --upstream``: the first
    request runs and its response is stored, then sent; a retry gets it with
    ``Idempotent-Replayed: true``; while the first runs, 409 (or, with
    ``Prefer: wait=N``, the first's response once stored); another request
    with the key, 422; bad or (``require_key``) missing keys 400; a store
    that cannot decide 503 (the app does not run); 5xx, 408, 425, 429 and an
    exception release the key. Problems are application/problem+json.

    Options: ``methods``, ``require_key``, ``namespace`` (callable(scope) ->
    str or awaitable; an exception gives 401), ``namespace_header``,
    ``authorization_key`` (bytes: callers known only by Authorization get an
    HMAC namespace), ``default_namespace``, ``max_request_bytes``,
    ``max_stored_body_bytes``, ``lease_ms``, ``heartbeat_s``,
    ``retention_s``, ``max_wait`` (cap of Prefer: wait, seconds),
    ``timeout`` (seconds: the app is cancelled past it, 504, key released),
    ``release_status``, ``fingerprint_headers``, ``stored_header_deny``.
    """

    def __init__(self, app: Any, client: AsyncClient, methods: Sequence[str] = ("POST", "PATCH"), require_key: bool = False,
                 namespace: Optional[Callable[[Scope], Union[str, Awaitable[str]]]] = None, namespace_header: Optional[str] = None,
                 authorization_key: Optional[bytes] = None, default_namespace: str = "default",
                 max_request_bytes: int = 1 << 20, max_stored_body_bytes: int = 1 << 20, lease_ms: int = 30_000,
                 heartbeat_s: Optional[float] = None, retention_s: Optional[int] = None, max_wait: float = 30.0,
                 timeout: float = 60.0, release_status: Callable[[int], bool] = default_release_status,
                 fingerprint_headers: Sequence[str] = (), stored_header_deny: Sequence[str] = ()):
        problems = []
        if not 100 <= lease_ms <= 600_000:
            problems.append(f"lease_ms {lease_ms} is outside 100..600000")
        if heartbeat_s is not None and not 0 < heartbeat_s * 1000 < lease_ms:
            problems.append(f"heartbeat_s {heartbeat_s} must be positive and below the lease")
        if not valid_namespace(default_namespace):
            problems.append(f"default_namespace {default_namespace!r} is not a valid namespace")
        if problems:
            raise InvalidArgumentError("INVALID_ARGUMENT", "idem: middleware: " + "; ".join(problems))
        self.app = app
        self.client = client
        self.methods = {m.upper() for m in methods}
        self.require_key = require_key
        self.namespace = namespace
        self.namespace_header = namespace_header
        self.authorization_key = authorization_key
        self.default_namespace = default_namespace
        self.max_request_bytes = max_request_bytes
        self.max_stored_body_bytes = max_stored_body_bytes
        self.lease_ms = lease_ms
        self.heartbeat_s = heartbeat_s or lease_ms / 3000
        self.retention_s = retention_s
        self.max_wait = max_wait
        self.timeout = timeout
        self.release_status = release_status
        self.fingerprint_headers = sorted({canonical_header(h) for h in fingerprint_headers})
        self.deny = {h.lower() for h in stored_header_deny}

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Dict[str, Any]]],
                       send: Callable[[Dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Keyed or not, only the middleware sets a fencing token.
        scope = dict(scope)
        scope["headers"] = [(k, v) for k, v in scope.get("headers", []) if not _is_fencing_header(k)]
        if scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        try:
            await self._serve(scope, receive, send)
        except Problem as p:
            await _send_problem(send, p)

    async def _namespace(self, scope: Scope) -> str:
        headers = scope["headers"]
        if self.namespace is not None:
            try:
                ns = self.namespace(scope)
                if inspect.isawaitable(ns):
                    ns = await ns
            except Exception as e:  # noqa: BLE001 - any failure to name the caller is a 401
                raise Problem(401, "missing-caller-identity", f"the caller could not be identified: {e}",
                              headers={"WWW-Authenticate": 'Namespace realm="idem"'})
            if not valid_namespace(ns):
                raise Problem(400, "invalid-namespace", f"the caller's namespace {ns!r} is not valid: use [a-z0-9][a-z0-9._-]{{0,62}}")
            return ns
        if self.namespace_header:
            values = header_lines(headers, self.namespace_header)
            if not values or values[0] == "":
                raise Problem(401, "missing-caller-identity",
                              f"requests with an {HEADER_KEY} must name their caller in the {self.namespace_header} header",
                              headers={"WWW-Authenticate": f'Namespace realm="idem", header="{self.namespace_header}"'})
            if len(values) > 1:
                raise Problem(400, "invalid-namespace", f"send exactly one {self.namespace_header} header")
            if not valid_namespace(values[0]):
                raise Problem(400, "invalid-namespace", f"{self.namespace_header} {values[0]!r} is not a valid namespace: use [a-z0-9][a-z0-9._-]{{0,62}}")
            return values[0]
        auth = header_lines(headers, "authorization")
        if self.authorization_key and auth:
            return namespace_from_authorization(self.authorization_key, ", ".join(auth))
        return self.default_namespace

    async def _read_body(self, scope: Scope, receive: Callable[[], Awaitable[Dict[str, Any]]]) -> bytes:
        too_large = Problem(413, "request-too-large", f"a request with an {HEADER_KEY} may carry at most {self.max_request_bytes} bytes of body")
        length = header_lines(scope["headers"], "content-length")
        if length and length[0].strip().isdigit() and int(length[0]) > self.max_request_bytes:
            raise too_large
        chunks: List[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Problem(400, "unreadable-request-body", "the client went away while sending the request body")
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_request_bytes:
                raise too_large
            chunks.append(body)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _serve(self, scope: Scope, receive: Callable[[], Awaitable[Dict[str, Any]]],
                     send: Callable[[Dict[str, Any]], Awaitable[None]]) -> None:
        headers = scope["headers"]
        present, key = parse_key(header_lines(headers, HEADER_KEY))
        if not present:
            if self.require_key:
                raise Problem(400, "missing-idempotency-key",
                              f"{scope['method']} requests here need an {HEADER_KEY} header: send a unique key (a UUID, say) and the same key with every retry of the request")
            await self.app(scope, receive, send)
            return
        ns = await self._namespace(scope)
        raw = await self._read_body(scope, receive)
        raw_path = scope.get("raw_path") or scope["path"].encode()
        raw_path = raw_path.split(b"?", 1)[0]
        fp = fingerprint(scope["method"], raw_path, scope.get("query_string", b""),
                         [(h, ", ".join(header_lines(headers, h))) for h in self.fingerprint_headers], raw)
        owner_token = new_owner_token()
        prefer = parse_prefer_wait(header_lines(headers, "prefer"))
        wait = 0.0 if prefer is None or self.max_wait < 0 else min(prefer, self.max_wait)
        sent_at = time.monotonic()
        try:
            res = await self.client.reserve(ns, key, fingerprint=fp, lease_ms=self.lease_ms, owner_token=owner_token, wait_ms=int(wait * 1000))
        except InvalidArgumentError as e:
            log.error("idem: middleware: the store refused a reserve of %s/%s: %s", ns, key, e)
            raise Problem(500, "internal-error", "the idempotency store refused the reservation")
        except IdemError as e:
            log.warning("idem: middleware: reserve of %s/%s failed; answering 503: %s", ns, key, e)
            raise Problem(503, "store-unavailable", "the idempotency store could not decide in time, so the request was not run: "
                                                    "retry it with the same Idempotency-Key after Retry-After", retry_after=1.0)
        if res.outcome == "COMPLETED":
            r = res.response or Response(500)
            out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in replayed_headers(r.headers).items()]
            out.append((HEADER_REPLAYED.lower().encode(), b"true"))
            if res.expires_at:
                out.append((HEADER_KEY_EXPIRES.lower().encode(), format_datetime(res.expires_at, usegmt=True).encode()))
            body = r.body if body_allowed(r.status) else b""
            if body_allowed(r.status):
                out.append((b"content-length", str(len(body)).encode()))  # recomputed: never stored
            await send({"type": "http.response.start", "status": r.status, "headers": out})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        if res.outcome == "IN_PROGRESS":
            detail = ("another request with this Idempotency-Key is running: retry after Retry-After to get its response" if wait <= 0 else
                      f"another request with this Idempotency-Key is still running after waiting {wait:g}s for it: retry after Retry-After to get its response")
            raise Problem(409, "request-in-progress", detail, retry_after=max(res.retry_after or 0.0, 1.0))
        if res.outcome == "FINGERPRINT_MISMATCH":
            raise Problem(422, "idempotency-key-reused", "this Idempotency-Key was used for a request with another method, path, query or body: use a new key for a new request")
        if res.outcome == "EXPIRED":
            raise Problem(410, "idempotency-key-expired", "this Idempotency-Key was used and its stored response has expired: the request was not run again; use a new key for a new request")
        if res.outcome not in ("ACQUIRED", "RECLAIMED"):
            raise Problem(500, "internal-error", "the idempotency store answered an unknown outcome")
        await self._run(scope, receive, send, ns, key, owner_token, res, sent_at, raw)

    async def _run(self, scope: Scope, receive: Callable[[], Awaitable[Dict[str, Any]]], send: Callable[[Dict[str, Any]], Awaitable[None]],
                   ns: str, key: str, owner_token: str, res: Any, sent_at: float, raw: bytes) -> None:
        if res.outcome == "RECLAIMED":
            log.info("idem: middleware: reclaimed %s/%s whose earlier attempt's lease ran out (previous fencing token %s); "
                     "that attempt may have done part of the work", ns, key, res.previous_fencing_token)
        info = Idempotency(key, ns, res.fencing_token or 0, res.outcome == "RECLAIMED", res.previous_fencing_token, res.lease_expires_at)
        inner = dict(scope)
        inner["headers"] = scope["headers"] + [(b"idempotency-fencing-token", str(info.fencing_token).encode())]
        inner["state"] = dict(scope.get("state") or {})
        inner["state"]["idempotency"] = info

        delivered = False

        async def replay_receive() -> Dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        capture = _Capture(send, self.max_stored_body_bytes)
        lease = Lease(info.fencing_token, info.reclaimed, info.previous_fencing_token, owner_token, info.expires_at, None, info.lost)
        app_task = asyncio.ensure_future(self.app(inner, replay_receive, capture))
        hb = asyncio.ensure_future(self.client.keep_lease(ns, key, lease, self.lease_ms, sent_at + self.lease_ms / 1000,
                                                          asyncio.get_running_loop().create_future(), self.heartbeat_s))
        try:
            await asyncio.wait_for(asyncio.shield(app_task), self.timeout)
        except asyncio.TimeoutError:
            app_task.cancel()
            hb.cancel()
            await self._release(ns, key, owner_token)
            if capture.overflow:
                return
            raise Problem(504, "upstream-timeout", f"the handler did not answer within {self.timeout:g}s; the request may be retried with the same key")
        except BaseException:
            # The app raised (Starlette's outer error middleware answers 500),
            # or we were cancelled: free the key so that a retry runs again.
            app_task.cancel()
            hb.cancel()
            await self._release(ns, key, owner_token)
            raise
        hb.cancel()
        if not capture.started:
            capture.status = 200  # an app that sent nothing: 200 with an empty body
        extra: List[Tuple[bytes, bytes]] = []
        if self.release_status(capture.status):
            await self._release(ns, key, owner_token)
        else:
            await self._complete(ns, key, owner_token, capture, extra)
        await capture.deliver(extra)

    async def _release(self, ns: str, key: str, owner_token: str) -> None:
        try:
            await self.client.release(ns, key, owner_token)
        except NotOwnerError:
            pass
        except IdemError as e:
            log.warning("idem: middleware: release of %s/%s failed; the key stays reserved until its lease runs out: %s", ns, key, e)

    async def _complete(self, ns: str, key: str, owner_token: str, capture: _Capture, extra: List[Tuple[bytes, bytes]]) -> None:
        hdrs, dropped = stored_headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in capture.headers], self.deny)
        if dropped:
            log.warning("idem: middleware: response headers beyond the store's bounds are not stored; replays lack them: %s", dropped)
        body = b""
        if capture.overflow:
            hdrs[HEADER_BODY_OMITTED] = "true"
        else:
            body = capture.body()
        try:
            try:
                _, expires_at = await self.client.complete(ns, key, owner_token, Response(capture.status, hdrs, body), self.retention_s)
            except PayloadTooLargeError:
                if capture.overflow:
                    raise
                log.warning("idem: middleware: the store refused the response body as too large; storing it without the body "
                            "(set max_stored_body_bytes to the store's --max-response-bytes)")
                hdrs[HEADER_BODY_OMITTED] = "true"
                _, expires_at = await self.client.complete(ns, key, owner_token, Response(capture.status, hdrs, b""), self.retention_s)
            if expires_at is not None:
                extra.append((HEADER_KEY_EXPIRES.lower().encode(), format_datetime(expires_at, usegmt=True).encode()))
        except NotOwnerError:
            log.warning("idem: middleware: lease of %s/%s lost: another request reclaimed the key while this one ran, so its response is not stored", ns, key)
        except (InvalidArgumentError, PayloadTooLargeError) as e:
            log.error("idem: middleware: the store refused the response of %s/%s; releasing the key so that a retry runs again: %s", ns, key, e)
            await self._release(ns, key, owner_token)
        except IdemError as e:
            log.error("idem: middleware: completing %s/%s failed; the key stays reserved until its lease runs out, and the next request "
                      "with it reclaims it: %s", ns, key, e)
