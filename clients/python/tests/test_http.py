"""The proxy's HTTP rules as the middleware applies them, without a node: the
fingerprint equals the Go engine's (httpidem) for the same request,
so a proxy and this middleware in front of one namespace agree; key and
Prefer parsing follow the proxy's."""

import pytest

from idem_client._http import Problem, fingerprint, parse_key, parse_prefer_wait


def test_fingerprints_match_the_go_engines_known_answers():
    # POST /payments/a%2Fb?currency=eur&x=1, X-Tenant: acme, body {"amount":100},
    # as httpidem computes it (with and without X-Tenant and body).
    assert fingerprint("POST", b"/payments/a%2Fb", b"currency=eur&x=1", [("X-Tenant", "acme")], b'{"amount":100}') == \
        "sha256:3d24864d1308813c3d43e24ee216d861e8cff5248cd63a6c3f7ab8bec62c14d6"
    assert fingerprint("POST", b"/payments/a%2Fb", b"currency=eur&x=1", [], b"") == \
        "sha256:7bd28fdd79091af49c38d1cf5ffb6dd3dcb36bc9f23305bd1b55819acaa77c8b"


@pytest.mark.parametrize("values,want", [
    ([], (False, "")),
    (["abc"], (True, "abc")),
    (['  "a\\"b\\\\c"  '], (True, 'a"b\\c')),
    (['"k";p=1'], "after the closing quote"),
    (['"open'], "no closing quote"),
    (['"a\\x"'], "invalid escape"),
    (["a b"], "position 1"),
    ([""], "empty"),
    (['""'], "empty"),
    (["a", "b"], "2 Idempotency-Key fields"),
    (["x" * 256], "256 bytes"),
])
def test_parse_key(values, want):
    if isinstance(want, str):
        with pytest.raises(Problem) as e:
            parse_key(values)
        assert want in e.value.detail and e.value.status == 400
    else:
        assert parse_key(values) == want


def test_parse_prefer_wait():
    assert parse_prefer_wait([]) is None
    assert parse_prefer_wait(["wait=10"]) == 10.0
    assert parse_prefer_wait(['respond-async, WAIT = "5" ; x=1']) == 5.0
    assert parse_prefer_wait(["return=minimal", "wait=3"]) == 3.0
    assert parse_prefer_wait(["wait=-1"]) is None
    assert parse_prefer_wait(["wait=soon"]) is None
