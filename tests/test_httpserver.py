"""The shared JSON reader of the webhooks and the extender: strict, bounded, never slow.

`json_depth` is checked against the depth of the decoded value for every JSON hypothesis
makes, so the pre-scan neither lets a deep body through nor refuses a shallow one.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish import httpserver
from pilotfish.httpserver import MAX_JSON_DEPTH, BadRequest, decode_json, json_depth

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\u00e9', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=40,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@given(JSON)
def test_json_depth_is_the_depth_of_the_decoded_value(value: Any) -> None:
    body = json.dumps(value, ensure_ascii=False).encode()
    assert json_depth(body) == depth(value) or (
        depth(value) <= MAX_JSON_DEPTH and json_depth(body) <= MAX_JSON_DEPTH
    )
    # Past the bound the exact pass runs: brackets in strings never count there.
    deep = ("[" * MAX_JSON_DEPTH + json.dumps(value) + "]" * MAX_JSON_DEPTH).encode()
    assert json_depth(deep) == MAX_JSON_DEPTH + depth(value)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "empty"),
        (b"\xff", "not UTF-8"),
        (b"[NaN]", "NaN is not a JSON number"),
        (b"[-Infinity]", "-Infinity is not a JSON number"),
        (b"[1e309]", "number 1e309 overflows"),
        (b"[" + b"9" * 5000 + b"]", "not valid JSON"),
        (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "65 levels deep"),
        (b'{"a": ' * 100_000, "100000 levels deep"),
    ],
)
def test_what_the_reader_refuses_and_why(body: bytes, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        decode_json(body)


def test_brackets_inside_strings_do_not_count() -> None:
    body = json.dumps({"annotation": "[" * 10_000, "x": [[1]]}).encode()
    assert decode_json(body)["x"] == [[1]]


@pytest.mark.parametrize(
    "body",
    [
        # Every quote inside one unterminated string: a scan that retries from each quote is
        # quadratic (20,000 of them took 6 s with the first pattern).
        b"[" * 65 + b'"' + b'\\"' * 2_000_000,
        b"[" * 65 + b'"a' * 2_000_000,
        b"[" * 65 + b'"\\' * 2_000_000,
    ],
)
def test_a_hostile_body_of_megabytes_is_refused_without_blocking(body: bytes) -> None:
    started = time.monotonic()
    with pytest.raises(BadRequest):
        decode_json(body)
    # The event loop must not stall on a parse; a linear scan of 4 MB takes milliseconds.
    assert time.monotonic() - started < 2.0


def test_tls_for_clients_trusts_only_the_client_ca(tmp_path: Any) -> None:
    """No system CA may vouch for a client: only the CA given."""
    from tests.servers import dev_pki

    certs = dev_pki(tmp_path)
    context = httpserver.server_tls(
        str(certs.cert("webhooks")), str(certs.key("webhooks")), str(certs.ca_cert)
    )
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "pilotfish-dev-ca"),),)
    ]
