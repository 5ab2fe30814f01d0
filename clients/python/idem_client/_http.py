"""The proxy's HTTP rules, shared by the middleware: the Idempotency-Key
header, the request fingerprint, Prefer: wait, problem+json answers and which
response headers are stored."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

HEADER_KEY = "Idempotency-Key"
HEADER_FENCING_TOKEN = "Idempotency-Fencing-Token"
HEADER_REPLAYED = "Idempotent-Replayed"
HEADER_BODY_OMITTED = "Idempotent-Body-Omitted"
HEADER_KEY_EXPIRES = "Idempotency-Key-Expires"
PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://idem.dev/problems/"
MAX_KEY_BYTES = 255

_NAMESPACE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")

#: The problems the middleware answers with: slug -> title (the proxy's).
PROBLEMS = {
    "invalid-idempotency-key": "Invalid Idempotency-Key",
    "missing-idempotency-key": "Idempotency-Key required",
    "missing-caller-identity": "Caller identity required",
    "invalid-namespace": "Invalid caller namespace",
    "request-too-large": "Request body too large",
    "unreadable-request-body": "Request body could not be read",
    "request-in-progress": "A request with this Idempotency-Key is in progress",
    "idempotency-key-reused": "Idempotency-Key reused for a different request",
    "idempotency-key-expired": "Idempotency-Key expired",
    "store-unavailable": "Idempotency store unavailable",
    "upstream-timeout": "Upstream timed out",
    "internal-error": "Internal error",
}


def valid_namespace(ns: object) -> bool:
    return isinstance(ns, str) and _NAMESPACE_RE.match(ns) is not None


class Problem(Exception):
    """An RFC 9457 problem the middleware answers with."""

    def __init__(self, status: int, slug: str, detail: str, retry_after: float = 0.0, headers: Optional[Dict[str, str]] = None):
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.retry_after = retry_after
        self.headers = headers or {}

    def body(self) -> bytes:
        return (json.dumps({"type": PROBLEM_TYPE_BASE + self.slug, "title": PROBLEMS[self.slug], "status": self.status,
                            "detail": self.detail}) + "\n").encode()

    def response_headers(self) -> List[Tuple[bytes, bytes]]:
        h = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        h += [(b"content-type", PROBLEM_CONTENT_TYPE.encode()), (b"cache-control", b"no-store")]
        if self.retry_after > 0:
            h.append((b"retry-after", str(retry_after_seconds(self.retry_after)).encode()))
        return h


def retry_after_seconds(seconds: float) -> int:
    """Whole seconds, rounded up, at least 1."""
    return max(int(-(-seconds // 1)), 1)


def parse_key(values: Sequence[str]) -> Tuple[bool, str]:
    """(present, key) of the Idempotency-Key field lines; raises Problem 400
    for a bad one. A structured-field string ("k", \\" and \\\\ escapes) or a
    bare value; 1 to 255 bytes of printable ASCII; one field line."""
    def bad(msg: str) -> Problem:
        return Problem(400, "invalid-idempotency-key", msg)

    if not values:
        return False, ""
    if len(values) > 1:
        raise bad(f"{len(values)} {HEADER_KEY} fields: send exactly one")
    v = values[0].strip(" \t")
    if v == "":
        raise bad(f"{HEADER_KEY} is empty: send a key of 1 to {MAX_KEY_BYTES} printable ASCII characters")
    if v[0] == '"':
        out = []
        i = 1
        closed = False
        while i < len(v):
            c = v[i]
            if c == "\\":
                i += 1
                if i == len(v) or v[i] not in '"\\':
                    raise bad(f'{HEADER_KEY} {v!r} has an invalid escape: only \\" and \\\\ are allowed in a quoted key')
                out.append(v[i])
            elif c == '"':
                if i != len(v) - 1:
                    raise bad(f"{HEADER_KEY} {v!r} has text after the closing quote (parameters are not supported)")
                closed = True
                break
            elif ord(c) < 0x20 or ord(c) > 0x7E:
                raise bad(f"{HEADER_KEY} has byte 0x{ord(c):02X} inside the quotes: use printable ASCII")
            else:
                out.append(c)
            i += 1
        if not closed:
            raise bad(f"{HEADER_KEY} {v!r} has no closing quote")
        v = "".join(out)
    if v == "":
        raise bad(f"the idempotency key is empty: use 1 to {MAX_KEY_BYTES} printable ASCII characters")
    if len(v) > MAX_KEY_BYTES:
        raise bad(f"the idempotency key is {len(v)} bytes long: use at most {MAX_KEY_BYTES}")
    for i, c in enumerate(v):
        if ord(c) < 0x21 or ord(c) > 0x7E:
            raise bad(f"the idempotency key has byte 0x{ord(c):02X} at position {i}: use printable ASCII without spaces (0x21-0x7E)")
    return True, v


def parse_prefer_wait(values: Iterable[str]) -> Optional[float]:
    """Prefer: wait=N in seconds (RFC 7240), or None when absent or not a
    non-negative integer. The first wait preference counts."""
    for v in values:
        for pref in v.split(","):
            pref = pref.split(";")[0]
            name, eq, val = pref.partition("=")
            if not eq or name.strip().lower() != "wait":
                continue
            val = val.strip().strip('"')
            if not re.fullmatch(r"[0-9]{1,10}", val) or int(val) > 0xFFFFFFFF:
                return None
            return float(int(val))
    return None


def fingerprint(method: str, raw_path: bytes, raw_query: bytes, header_fields: Sequence[Tuple[str, str]], body: bytes) -> str:
    """The proxy's fingerprint: SHA-256 over a version tag, the method, the
    path as sent, the raw query and the named headers, each length-prefixed
    (8-byte big-endian), then the body: "sha256:" + 64 hex digits."""
    h = hashlib.sha256()

    def field(b: bytes) -> None:
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)

    field(b"idem-http-fingerprint-v1")
    field(method.encode("latin-1"))
    field(raw_path)
    field(raw_query)
    for name, value in header_fields:
        field(name.encode("latin-1"))
        field(value.encode("latin-1"))
    h.update(body)
    return "sha256:" + h.hexdigest()


def namespace_from_authorization(key: bytes, value: str) -> str:
    """The namespace of a request known only by its Authorization header."""
    return "auth-" + hmac.new(key, value.encode("latin-1"), hashlib.sha256).hexdigest()[:40]


def canonical_header(name: str) -> str:
    return "-".join(p[:1].upper() + p[1:] for p in name.lower().split("-"))


# Hop-by-hop headers, cookies, the per-response Date and Content-Length (a
# replay is a new message: the server dates it and frames its body) and the
# replay markers: never stored, and never replayed from a record that holds
# them (one completed through the JSON API, or by another producer).
_NEVER_STORED = {
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "set-cookie", "set-cookie2", "content-length", "date", "idempotent-replayed",
    "idempotent-body-omitted", "idempotency-key-expires",
}


def replayed_headers(stored: Mapping[str, str]) -> Dict[str, str]:
    """The stored headers a replay sends: all but those never stored (except
    the body-omitted marker, which the middleware stores itself) and those a
    stored Connection header names."""
    connection = {n.strip().lower() for k, v in stored.items() if k.lower() == "connection" for n in v.split(",") if n.strip()}
    return {k: v for k, v in stored.items()
            if k.lower() == HEADER_BODY_OMITTED.lower() or k.lower() not in _NEVER_STORED and k.lower() not in connection}
_TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_CTL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def stored_headers(headers: Sequence[Tuple[str, str]], deny: Set[str]) -> Tuple[Dict[str, str], List[str]]:
    """The response headers to store: multiple values joined with ", ",
    minus hop-by-hop headers, cookies, Content-Length and the replay markers,
    within the store's bounds (100 headers, 256-byte names, 8 KiB values
    without control characters, 64 KiB in all; one entry kept free for the
    body-omitted marker). Returns (stored, dropped)."""
    joined: Dict[str, List[str]] = {}
    for name, value in headers:
        joined.setdefault(name.lower(), []).append(value)
    connection = {n.strip().lower() for v in joined.get("connection", []) for n in v.split(",") if n.strip()}
    stored: Dict[str, str] = {}
    dropped: List[str] = []
    total = 0
    for lower in sorted(joined):
        if lower in _NEVER_STORED or lower in connection or lower in deny:
            continue
        name = canonical_header(lower)
        value = ", ".join(joined[lower])
        ok = len(name) <= 256 and _TOKEN_RE.match(name) and len(value) <= 8192 and not _CTL_RE.search(value)
        if not ok or len(stored) >= 99 or total + len(name) + len(value) > 65536 - len(HEADER_BODY_OMITTED) - 4:
            dropped.append(name)
            continue
        stored[name] = value
        total += len(name) + len(value)
    return stored, dropped


def default_release_status(status: int) -> bool:
    """Statuses whose response is not final: 5xx, 408, 425, 429."""
    return status >= 500 or status in (408, 425, 429)


def body_allowed(status: int) -> bool:
    return not (status < 200 or status in (204, 304))


def header_lines(headers: Sequence[Tuple[bytes, bytes]], name: str) -> List[str]:
    n = name.lower().encode("latin-1")
    return [v.decode("latin-1") for k, v in headers if k.lower() == n]
