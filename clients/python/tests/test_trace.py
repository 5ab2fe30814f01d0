"""Trace context: with the OpenTelemetry API importable and a span active,
the clients and the ASGI middleware send its traceparent on every call to
idem; without either, nothing. OpenTelemetry is optional (no dependency), so
the test stands in a minimal `opentelemetry.propagate` whose inject writes
the active span of a context variable, as the real API does."""

import asyncio
import contextvars
import http.client
import sys
import threading
import types
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from idem_client import AsyncClient, Client, _core

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
active_span = contextvars.ContextVar("active_span", default=None)


@pytest.fixture
def otel(monkeypatch):
    """A stand-in for the OpenTelemetry API: propagate.inject writes the
    active span's traceparent (and a baggage entry, which idem must not
    send)."""
    def inject(carrier):
        tp = active_span.get()
        if tp:
            carrier["traceparent"] = tp
            carrier["baggage"] = "user=alice"

    pkg = types.ModuleType("opentelemetry")
    propagate = types.ModuleType("opentelemetry.propagate")
    propagate.inject = inject
    pkg.propagate = propagate
    monkeypatch.setitem(sys.modules, "opentelemetry", pkg)
    monkeypatch.setitem(sys.modules, "opentelemetry.propagate", propagate)
    monkeypatch.setattr(_core, "_otel_propagate", _core._UNSET)
    yield
    _core._otel_propagate = _core._UNSET


class Recorder:
    """An HTTP proxy in front of the node that records the trace headers of
    every request it passes on."""

    def __init__(self, upstream: str):
        u = urlsplit(upstream)
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._pass()

            def do_POST(self):
                self._pass()

            def _pass(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                seen.append((self.command, self.path, self.headers.get("traceparent"), self.headers.get("baggage")))
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder(node):
    r = Recorder(node.url)
    yield r
    r.close()


def test_client_sends_active_traceparent(otel, recorder):
    c = Client(recorder.url)
    token = active_span.set(TRACEPARENT)
    try:
        res = c.reserve("payments", str(uuid.uuid4()))
    finally:
        active_span.reset(token)
    c.reserve("payments", str(uuid.uuid4()))
    assert res.owner_token
    (traced, untraced) = [s for s in recorder.seen if s[1].endswith(":reserve")]
    assert traced[2] == TRACEPARENT and traced[3] is None, traced
    assert untraced[2] is None, untraced


def test_async_client_sends_active_traceparent(otel, recorder):
    async def main():
        async with AsyncClient(recorder.url) as c:
            token = active_span.set(TRACEPARENT)
            try:
                await c.reserve("payments", str(uuid.uuid4()))
            finally:
                active_span.reset(token)

    asyncio.run(main())
    (traced,) = [s for s in recorder.seen if s[1].endswith(":reserve")]
    assert traced[2] == TRACEPARENT, traced


def test_no_opentelemetry_sends_nothing(monkeypatch, recorder):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails
    monkeypatch.setattr(_core, "_otel_propagate", _core._UNSET)
    Client(recorder.url).reserve("payments", str(uuid.uuid4()))
    assert _core._otel_propagate is None
    assert all(s[2] is None for s in recorder.seen), recorder.seen


def test_asgi_middleware_sends_request_traceparent(otel, recorder):
    starlette = pytest.importorskip("starlette")  # noqa: F841 (the ASGI suite's own dependency)
    import httpx
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from idem_client.asgi import IdempotencyMiddleware

    class TraceMiddleware:
        """Stands in for OpenTelemetry's ASGI instrumentation: the request's
        span is active while the app below runs."""

        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            token = active_span.set(TRACEPARENT)
            try:
                await self.app(scope, receive, send)
            finally:
                active_span.reset(token)

    async def pay(request):
        return PlainTextResponse("paid", status_code=201)

    async def main():
        async with AsyncClient(recorder.url) as idem:
            app = Starlette(routes=[Route("/payments", pay, methods=["POST"])],
                            middleware=[Middleware(TraceMiddleware), Middleware(IdempotencyMiddleware, client=idem)])
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as c:
                r = await c.post("/payments", content=b"{}", headers={"Idempotency-Key": str(uuid.uuid4())})
                assert r.status_code == 201

    asyncio.run(main())
    calls = {s[1].rsplit(":", 1)[-1]: s[2] for s in recorder.seen if ":" in s[1]}
    assert calls.get("reserve") == TRACEPARENT and calls.get("complete") == TRACEPARENT, recorder.seen
