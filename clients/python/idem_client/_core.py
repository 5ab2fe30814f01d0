"""What the sync and asyncio clients share: the wire format, the types, one
HTTP attempt over http.client, and the retry rule."""

from __future__ import annotations

import base64
import json
import re
import secrets
import ssl
import threading
import http.client
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from .errors import IdemError, UnavailableError, InvalidArgumentError, PayloadTooLargeError, error_from_answer

#: Defaults of the clients and of run().
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_MAX_RETRY_AFTER = 10.0
#: The JSON request body limit of a node or router with the default
#: --max-response-bytes (1 MiB): room for a 1 MiB response in base64, doubled
#: for escaped '/', plus 512 KiB (docs/api.md, "Limits and backpressure").
DEFAULT_MAX_REQUEST_BYTES = 2 * ((1 << 20) + 2) // 3 * 4 + (512 << 10)
#: A batch call's body limit is at least 4 MiB.
MIN_BATCH_BODY_BYTES = 4 << 20
DEFAULT_LEASE_MS = 30_000
DEFAULT_MAX_WAIT = 10.0
STORE_MAX_WAIT_MS = 30_000

Body = Union[bytes, bytearray, str, None]


def new_owner_token() -> str:
    """A fresh owner token: 22 characters of base64url (128 random bits)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()


def _time(s: Any) -> Optional[datetime]:
    if not isinstance(s, str):
        return None
    # RFC 3339 with up to nanoseconds: Python keeps microseconds.
    m = re.match(r"^(.*?T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", s)
    if not m:
        return None
    frac = (m.group(2) or "")[:6].ljust(6, "0")
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(f"{m.group(1)}.{frac}{tz}").astimezone(timezone.utc)


def _token(s: Any) -> Optional[int]:
    return int(s) if isinstance(s, str) and s != "" else None


def _b64decode(s: Any) -> bytes:
    if not s:
        return b""
    s = s.replace("-", "+").replace("_", "/")
    return base64.b64decode(s + "=" * (-len(s) % 4))


def encode_body(body: Body) -> str:
    if body is None:
        return ""
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError("INVALID_ARGUMENT", "idem: a response body must be bytes or str")
    return base64.b64encode(bytes(body)).decode()


@dataclass
class Response:
    """A stored HTTP-like response: what a key was completed with, replayed verbatim."""

    status: int
    headers: Dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def to_json(self) -> Dict[str, Any]:
        if not isinstance(self.status, int):
            raise InvalidArgumentError("INVALID_ARGUMENT", "idem: a response needs an int status (100..599)")
        return {"status": self.status, "headers": dict(self.headers or {}), "body": encode_body(self.body)}

    @classmethod
    def from_json(cls, r: Optional[Dict[str, Any]]) -> Optional["Response"]:
        if r is None:
            return None
        return cls(status=r.get("status", 0), headers=r.get("headers") or {}, body=_b64decode(r.get("body")))


def as_response(r: Any) -> Response:
    """Accepts a Response, or a (status, headers, body) tuple, or a dict."""
    if isinstance(r, Response):
        return r
    if isinstance(r, tuple):
        return Response(*r)
    if isinstance(r, dict):
        return Response(status=r.get("status"), headers=r.get("headers") or {}, body=r.get("body") or b"")
    raise InvalidArgumentError("INVALID_ARGUMENT", f"idem: fn must return a Response, a (status, headers, body) tuple or a dict, not {type(r).__name__}")


@dataclass
class Checkpoint:
    """The last checkpoint of an attempt (v1.2)."""

    name: str
    data: bytes
    fencing_token: Optional[int]
    checkpointed_at: Optional[datetime]

    @classmethod
    def from_json(cls, c: Optional[Dict[str, Any]]) -> Optional["Checkpoint"]:
        if c is None:
            return None
        return cls(c.get("name", ""), _b64decode(c.get("data")), _token(c.get("fencing_token")), _time(c.get("checkpointed_at")))


@dataclass
class Reservation:
    """What the store decided on a reserve. ``outcome`` is one of ACQUIRED,
    RECLAIMED, IN_PROGRESS, COMPLETED, FINGERPRINT_MISMATCH, EXPIRED (v1.2);
    the other fields are set as the contract's table says."""

    outcome: str
    owner_token: Optional[str] = None
    fencing_token: Optional[int] = None
    previous_fencing_token: Optional[int] = None
    lease_expires_at: Optional[datetime] = None
    #: IN_PROGRESS: when to ask again, in seconds (a hint).
    retry_after: Optional[float] = None
    response: Optional[Response] = None
    completed_at: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    expired_at: Optional[datetime] = None
    checkpoint: Optional[Checkpoint] = None

    @classmethod
    def from_json(cls, a: Dict[str, Any]) -> "Reservation":
        ra = a.get("retry_after_ms")
        return cls(
            outcome=a.get("outcome", ""),
            owner_token=a.get("owner_token"),
            fencing_token=_token(a.get("fencing_token")),
            previous_fencing_token=_token(a.get("previous_fencing_token")),
            lease_expires_at=_time(a.get("lease_expires_at")),
            retry_after=None if ra is None else ra / 1000.0,
            response=Response.from_json(a.get("response")),
            completed_at=_time(a.get("completed_at")),
            expires_at=_time(a.get("expires_at")),
            expired_at=_time(a.get("expired_at")),
            checkpoint=Checkpoint.from_json(a.get("checkpoint")),
        )


@dataclass
class Record:
    """A key's record (GET): state IN_PROGRESS, COMPLETED or EXPIRED (v1.2)."""

    state: str
    fingerprint: str
    fencing_token: Optional[int]
    lease_expires_at: Optional[datetime] = None
    completed_at: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    expired_at: Optional[datetime] = None
    response: Optional[Response] = None
    checkpoint: Optional[Checkpoint] = None

    @classmethod
    def from_json(cls, a: Dict[str, Any]) -> "Record":
        return cls(
            state=a.get("state", ""),
            fingerprint=a.get("fingerprint", ""),
            fencing_token=_token(a.get("fencing_token")),
            lease_expires_at=_time(a.get("lease_expires_at")),
            completed_at=_time(a.get("completed_at")),
            expires_at=_time(a.get("expires_at")),
            expired_at=_time(a.get("expired_at")),
            response=Response.from_json(a.get("response")),
            checkpoint=Checkpoint.from_json(a.get("checkpoint")),
        )


@dataclass
class KeyEntry:
    key: str
    state: str
    fencing_token: Optional[int]
    created_at: Optional[datetime]
    lease_expires_at: Optional[datetime] = None
    completed_at: Optional[datetime] = None
    expires_at: Optional[datetime] = None


@dataclass
class KeyPage:
    keys: List[KeyEntry]
    next_page_token: Optional[str] = None

    @classmethod
    def from_json(cls, a: Dict[str, Any]) -> "KeyPage":
        return cls(
            keys=[KeyEntry(k.get("key", ""), k.get("state", ""), _token(k.get("fencing_token")), _time(k.get("created_at")),
                           _time(k.get("lease_expires_at")), _time(k.get("completed_at")), _time(k.get("expires_at")))
                  for k in a.get("keys") or []],
            next_page_token=a.get("next_page_token"),
        )


@dataclass
class Policy:
    """A namespace's policy (v1.2); None is the built-in default."""

    default_lease_ms: Optional[int] = None
    max_lease_ms: Optional[int] = None
    default_retention_s: Optional[int] = None
    max_retention_s: Optional[int] = None
    #: How long a tombstone outlives a completed record's retention (default 604800; 0 keeps none).
    tombstone_s: Optional[int] = None

    FIELDS = ("default_lease_ms", "max_lease_ms", "default_retention_s", "max_retention_s", "tombstone_s")

    def to_json(self) -> Dict[str, Any]:
        return {f: getattr(self, f) for f in self.FIELDS if getattr(self, f) is not None}

    @classmethod
    def from_json(cls, a: Dict[str, Any]) -> "Policy":
        # The contract answers the policy's fields; accept them wrapped in
        # {"policy": ...} as well, the shape of the gRPC answer.
        if isinstance(a.get("policy"), dict):
            a = a["policy"]
        return cls(**{f: a.get(f) for f in cls.FIELDS})


@dataclass
class BatchError:
    """One item's failure in a batch call (v1.2): the error the single call would have raised."""

    error: IdemError


def batch_reserve_body(items: List[Dict[str, Any]]) -> Dict[str, Any]:
    out = []
    for it in items:
        o: Dict[str, Any] = {"key": it["key"], "owner_token": it.get("owner_token") or new_owner_token()}
        if it.get("fingerprint") is not None:
            o["fingerprint"] = it["fingerprint"]
        if it.get("lease_ms"):
            o["lease_ms"] = int(it["lease_ms"])
        out.append(o)
    return {"items": out}


def batch_complete_body(items: List[Dict[str, Any]]) -> Dict[str, Any]:
    out = []
    for it in items:
        o: Dict[str, Any] = {"key": it["key"], "owner_token": it["owner_token"], "response": as_response(it["response"]).to_json()}
        if it.get("retention_s"):
            o["retention_s"] = int(it["retention_s"])
        out.append(o)
    return {"items": out}


def batch_results(a: Dict[str, Any], decode: Any) -> List[Any]:
    return [BatchError(error_from_answer(0, r, 0.0)) if "error" in r else decode(r) for r in a.get("results") or []]


def ns_path(ns: str, rest: str) -> str:
    return f"/v1/namespaces/{quote(ns, safe='')}/{rest}"


@dataclass
class RunResult:
    """The response of a key that run() completed or replayed."""

    response: Response
    #: The key was completed before; fn did not run.
    replayed: bool
    fencing_token: Optional[int]
    completed_at: Optional[datetime]
    expires_at: Optional[datetime]


def key_path(ns: str, key: str) -> str:
    return f"/v1/namespaces/{quote(ns, safe='')}/keys/{quote(key, safe='')}"


def list_path(ns: str, state: Optional[str], older_than_s: Optional[int], limit: Optional[int], page_token: Optional[str]) -> str:
    q = {k: v for k, v in (("state", state), ("older_than_s", older_than_s), ("limit", limit), ("page_token", page_token)) if v}
    return f"/v1/namespaces/{quote(ns, safe='')}/keys" + (f"?{urlencode(q)}" if q else "")


def reserve_body(fingerprint: Optional[str], lease_ms: Optional[int], owner_token: Optional[str], wait_ms: Optional[int],
                 if_expired: Optional[str]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"owner_token": owner_token or new_owner_token()}
    if fingerprint is not None:
        body["fingerprint"] = fingerprint
    if lease_ms:
        body["lease_ms"] = int(lease_ms)
    if wait_ms:
        body["wait_ms"] = int(wait_ms)
    if if_expired:
        body["if_expired"] = if_expired
    return body


def parse_retry_after(v: Optional[str]) -> float:
    if not v:
        return 0.0
    try:
        return max(float(v), 0.0)
    except ValueError:
        pass
    try:
        at = parsedate_to_datetime(v)
        return max((at - datetime.now(timezone.utc)).total_seconds(), 0.0)
    except (TypeError, ValueError):
        return 0.0


class Answer:
    """One HTTP answer of the API."""

    def __init__(self, status: int, headers: Dict[str, str], text: bytes):
        self.status = status
        self.headers = headers
        self.text = text

    def decode(self, method: str, path: str) -> Tuple[Optional[Dict[str, Any]], Optional[IdemError]]:
        """The JSON body of a 2xx answer, or the error of another."""
        try:
            parsed = json.loads(self.text) if self.text else {}
        except ValueError:
            parsed = None
        if 200 <= self.status < 300:
            if parsed is None:
                return None, IdemError("INTERNAL", f"idem: {method} {path}: the answer is not JSON", status=self.status)
            return parsed, None
        return None, error_from_answer(self.status, parsed, parse_retry_after(self.headers.get("retry-after")))


def retry_wait(err: IdemError, attempt: int, max_retry_after: float) -> Optional[float]:
    """How long to wait before the next attempt after err, or None when err is
    final. 503 and 429 say the store did not apply the call: ask again after
    Retry-After. A transport failure (status 0) may have applied it; every call
    the clients make is safe to repeat, so it is retried after a backoff."""
    if err.status in (503, 429):
        return min(max(err.retry_after, 0.05), max_retry_after)
    if err.status == 0 and isinstance(err, UnavailableError):
        return min(0.1 * 2 ** (attempt - 1), max_retry_after)
    return None


_UNSET = object()
_otel_propagate: Any = _UNSET

#: The W3C trace context fields a call carries.
TRACE_FIELDS = ("traceparent", "tracestate")


def trace_headers() -> Dict[str, str]:
    """The W3C trace context (traceparent, tracestate) of the caller's active
    OpenTelemetry span, so that idem's spans join the application's trace.
    Through the OpenTelemetry API (opentelemetry.propagate) when it is
    installed; the client does not depend on it: without it, or without an
    active span, {}."""
    global _otel_propagate
    if _otel_propagate is _UNSET:
        try:
            from opentelemetry import propagate  # optional: only when the application uses OpenTelemetry
            _otel_propagate = propagate
        except ImportError:
            _otel_propagate = None
    if _otel_propagate is None:
        return {}
    carrier: Dict[str, str] = {}
    _otel_propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k.lower() in TRACE_FIELDS}


class Transport:
    """Sends one request with http.client over a per-thread keep-alive
    connection; TLS (a private CA, mTLS) through an ssl.SSLContext."""

    def __init__(self, base_url: str, timeout: float, ssl_context: Optional[ssl.SSLContext], token: Optional[str],
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        u = urlsplit(base_url)
        self.max_request_bytes = max_request_bytes
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InvalidArgumentError("INVALID_ARGUMENT", f"idem: base_url {base_url!r} must be http(s)://host:port")
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.token = token
        self.local = threading.local()

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            if self.https:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.ssl_context)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            self.local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def attempt(self, method: str, path: str, body: Optional[Dict[str, Any]], extra_timeout: float = 0.0,
                timeout: Optional[float] = None, trace: Optional[Dict[str, str]] = None) -> Answer:
        """One attempt, bounded by timeout (default: the client's, plus
        extra_timeout, plus a second per MiB of request body); a transport
        failure raises UnavailableError (status 0). trace is the caller's
        trace context (trace_headers(), taken here when None)."""
        headers = {"Accept": "application/json"}
        headers.update(trace_headers() if trace is None else trace)
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
            # A request carrying megabytes (a completion's response, a batch)
            # gets a second per MiB more, as nodes and routers give it: the
            # store writes it to a majority of its replicas before it answers.
            extra_timeout += len(payload) / (1 << 20)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._conn(timeout if timeout is not None else self.timeout + extra_timeout)
        try:
            try:
                conn.request(method, self.prefix + path, body=payload, headers=headers)
            except (ConnectionResetError, BrokenPipeError) as e:
                # A server refuses a body over its limit (413) without reading
                # it, and closes the connection: the answer may be waiting.
                answer = self._early_answer(conn)
                if answer is not None:
                    return answer
                limit = self.max_request_bytes
                if ":batch-" in path:
                    limit = max(limit, MIN_BATCH_BODY_BYTES)
                if payload is not None and len(payload) > limit:
                    raise PayloadTooLargeError(
                        "PAYLOAD_TOO_LARGE",
                        f"idem: {method} {path}: the request body is {len(payload)} bytes, more than the {limit} a node "
                        f"takes by default, and the server closed the connection while it was sent ({e!r}): "
                        "store a smaller response, or raise max_request_bytes for nodes run with a larger --max-response-bytes",
                        status=413) from e
                raise
            r = conn.getresponse()
            text = r.read()
            return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, text)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            self.local.conn = None
            raise UnavailableError("UNAVAILABLE", f"idem: {method} {path}: {e!r}") from e

    @staticmethod
    def _early_answer(conn: http.client.HTTPConnection) -> Optional[Answer]:
        """The answer a server wrote before the request body was sent whole,
        or None."""
        try:
            r = conn.getresponse()
            text = r.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, text)
