"""The Prometheus client against a real HTTP server speaking Prometheus's API: vectors and
scalars parsed, and every failure one PromQLError saying which kind."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pilotfish.promql import PrometheusClient, PromQLError, Sample, parse_response
from tests.servers import free_port

Handler = Callable[[web.Request], Any]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Any]]:
    servers: list[TestServer] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/api/v1/query", handler)
        server = TestServer(app, host="127.0.0.1", port=free_port())
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for s in servers:
        await s.close()


def vector(*series: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [1700000000.5, v]} for m, v in series],
        },
    }


async def test_a_vector_is_parsed_and_the_query_is_posted(serve: Any) -> None:
    seen: dict[str, str] = {}

    async def handler(request: web.Request) -> web.Response:
        seen.update({k: str(v) for k, v in (await request.post()).items()})
        seen["method"] = request.method
        return web.json_response(vector(({"node": "n1", "pod": "p"}, "3.2"), ({}, "NaN")))

    client = PrometheusClient(await serve(handler), timeout=2)
    try:
        got = await client.query('sum by (node) (rate(x{a="b"}[1m]))')
    finally:
        await client.close()
    assert got[0] == Sample({"node": "n1", "pod": "p"}, 3.2, 1700000000.5)
    assert math.isnan(got[1].value)
    assert seen == {
        "query": 'sum by (node) (rate(x{a="b"}[1m]))',
        "timeout": "2s",
        "method": "POST",
    }


async def test_prometheus_errors_carry_its_error_type(serve: Any) -> None:
    async def handler(_: web.Request) -> web.Response:
        body = {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
        return web.json_response(body, status=400)

    client = PrometheusClient(await serve(handler))
    try:
        with pytest.raises(PromQLError) as e:
            await client.query("sum(")
    finally:
        await client.close()
    assert (e.value.error_type, e.value.error, e.value.status) == (
        "bad_data",
        "parse error at char 3",
        400,
    )
    assert e.value.expr == "sum("


async def test_a_non_json_answer_is_an_http_error(serve: Any) -> None:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(status=503, text="Service Unavailable")

    client = PrometheusClient(await serve(handler))
    try:
        with pytest.raises(PromQLError) as e:
            await client.query("up")
    finally:
        await client.close()
    assert e.value.error_type == "http" and "503" in e.value.error


async def test_a_slow_prometheus_is_a_timeout(serve: Any) -> None:
    async def handler(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response(vector())

    client = PrometheusClient(await serve(handler), timeout=0.2)
    try:
        with pytest.raises(PromQLError) as e:
            await client.query("up")
    finally:
        await client.close()
    assert e.value.error_type == "timeout"


async def test_nothing_listening_is_a_connection_error() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    try:
        with pytest.raises(PromQLError) as e:
            await client.query("up")
    finally:
        await client.close()
    assert e.value.error_type == "connection"


def test_a_scalar_is_one_sample_without_labels() -> None:
    body = {"status": "success", "data": {"resultType": "scalar", "result": [5.0, "42"]}}
    assert parse_response("time()", body) == [Sample({}, 42.0, 5.0)]


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"status": "success"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        {"status": "success", "data": {"resultType": "vector", "result": [{"value": "x"}]}},
        {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "a"]}]}},
    ],
)
def test_answers_that_are_no_instant_vector_are_errors(body: Any) -> None:
    with pytest.raises(PromQLError) as e:
        parse_response("q", body)
    assert e.value.error_type == "bad_response"


async def test_a_large_answer_arriving_in_pieces_is_read_whole(serve: Any) -> None:
    """A cluster's every pod is megabytes of JSON, sent in chunks: all of it is parsed."""
    pods = 20_000
    body = json.dumps(vector(*(({"pod": f"p{i}"}, "0.5") for i in range(pods)))).encode()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for at in range(0, len(body), 1 << 16):
            await resp.write(body[at : at + (1 << 16)])
            await asyncio.sleep(0.001)  # the next piece has not arrived yet
        await resp.write_eof()
        return resp

    client = PrometheusClient(await serve(handler), timeout=10)
    try:
        got = await client.query("pod_cpu")
    finally:
        await client.close()
    assert len(got) == pods and got[-1].labels == {"pod": f"p{pods - 1}"}
