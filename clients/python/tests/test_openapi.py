"""The node's OpenAPI document (v1.2, GET /openapi.json) against the
clients: every operation of the JSON API it lists has a method on Client and
AsyncClient. Skipped, saying so, against a node that serves no document yet."""

import json
import re
import urllib.error
import urllib.request

import pytest

from idem_client import AsyncClient, Client

# Each operation of the contract and the method that makes it; path
# parameters are written {}.
OPERATIONS = {
    "POST /v1/namespaces/{}/keys/{}:reserve": "reserve",
    "POST /v1/namespaces/{}/keys/{}:heartbeat": "heartbeat",
    "POST /v1/namespaces/{}/keys/{}:complete": "complete",
    "POST /v1/namespaces/{}/keys/{}:release": "release",
    "POST /v1/namespaces/{}/keys/{}:checkpoint": "checkpoint",
    "POST /v1/namespaces/{}/keys/{}:force-release": "force_release",
    "GET /v1/namespaces/{}/keys/{}": "get",
    "DELETE /v1/namespaces/{}/keys/{}": "delete_key",
    "GET /v1/namespaces/{}/keys": "list_keys",
    "POST /v1/namespaces/{}/keys:batch-reserve": "batch_reserve",
    "POST /v1/namespaces/{}/keys:batch-complete": "batch_complete",
    "GET /v1/namespaces/{}/policy": "get_policy",
    "PUT /v1/namespaces/{}/policy": "set_policy",
}
# Operator and topology tooling (idemctl) and probes are not the clients'.
NOT_CLIENT = [r"^(GET|PUT) /v1/topology", r"^(GET|POST|PUT|DELETE) /v1/admin", r"^GET /(healthz|readyz|metrics|openapi\.json)$"]


def test_every_operation_has_a_method(node):
    try:
        with urllib.request.urlopen(node.url + "/openapi.json", timeout=10) as r:
            doc = json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            pytest.skip("this idemnode serves no /openapi.json (v1.2)")
        raise
    missing = []
    for path, item in (doc.get("paths") or {}).items():
        for method in item:
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            op = f"{method.upper()} {re.sub(r'{[^}]*}', '{}', path)}"
            if any(re.search(p, op) for p in NOT_CLIENT):
                continue
            name = OPERATIONS.get(op)
            if not name or not callable(getattr(Client, name, None)) or not callable(getattr(AsyncClient, name, None)):
                missing.append(op)
    assert missing == [], "operations of the API without a client method"
