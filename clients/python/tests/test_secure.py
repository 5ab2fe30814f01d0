"""The clients against a secure dev node (TLS with a private CA, an auth
file): bearer tokens, client certificates (mTLS) and the auth errors."""

import asyncio
import hashlib
import shutil
import ssl
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import make_certs, start_node, stop_node
from idem_client import AsyncClient, Client, PermissionDeniedError, Response, UnauthenticatedError


@pytest.fixture(scope="module")
def secure():
    tmp = Path(tempfile.mkdtemp(prefix="idem-py-secure-"))
    certs = make_certs(tmp, "alice")
    auth = tmp / "auth.yaml"
    auth.write_text("\n".join([
        "principals:",
        "  - name: billing-api",
        f"    token_sha256: {hashlib.sha256(b'billing-token').hexdigest()}",
        "    namespaces: [billing]",
        "    role: writer",
        "  - name: alice",
        '    namespaces: ["alice-*"]',
        "    role: writer",
        "",
    ]))
    n = start_node(tmp, certs=certs, auth_file=auth)
    yield n, certs
    try:
        stop_node(n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_bearer_token_over_tls(secure):
    n, certs = secure
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    c = Client(n.url, token="billing-token", ssl_context=ctx)
    key = str(uuid.uuid4())
    assert not c.run("billing", key, lambda lease: (201, {}, b"paid")).replayed
    assert c.get("billing", key).state == "COMPLETED"
    with pytest.raises(PermissionDeniedError):
        c.reserve("other", key)
    with pytest.raises(UnauthenticatedError) as e:
        Client(n.url, ssl_context=ctx).reserve("billing", key)
    assert e.value.status == 401
    with pytest.raises(UnauthenticatedError):
        Client(n.url, token="not-the-token", ssl_context=ctx).get("billing", key)


def test_client_certificate_names_the_principal(secure):
    n, certs = secure
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    ctx.load_cert_chain(str(certs / "client.alice.crt"), str(certs / "client.alice.key"))

    async def main():
        async with AsyncClient(n.url, ssl_context=ctx) as c:
            key = str(uuid.uuid4())
            r = await c.reserve("alice-orders", key)
            assert r.outcome == "ACQUIRED"
            await c.complete("alice-orders", key, r.owner_token, Response(200))
            with pytest.raises(PermissionDeniedError):
                await c.reserve("billing", key)

    asyncio.run(main())
