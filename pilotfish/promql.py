"""A small client of Prometheus's HTTP API: instant queries, nothing else.

Usage lives in a time-series store, not in etcd, so a controller that sizes capacity from
usage asks Prometheus each cycle. The reclaim controller must tell "no sample" (a pod not
scraped yet: it counts as its request) from "Prometheus did not answer" (every figure is
untrusted and decays), so every failure, whether Prometheus's own (`errorType`/`error`), an
HTTP status, a connection failure or the timeout, is one `PromQLError` saying which.

Controllers depend on the `PromQL` protocol, so tests hand them a fake that answers from
a table and the controller cannot tell.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import aiohttp

DEFAULT_TIMEOUT: Final = 10.0
# Prometheus's answer to one instant query is a few thousand series at most here; a body
# far larger than that is not a vector this client was asked for.
MAX_BODY: Final = 64 * 1024 * 1024


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector (or the one value of a scalar, with no labels)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    value: float = math.nan
    timestamp: float = 0.0


class PromQLError(Exception):
    """A query that gave no result: `error_type` is Prometheus's errorType (bad_data,
    execution, timeout, unavailable, ...) or this client's `http`, `connection`, `timeout`,
    `bad_response`; `error` the words that go with it."""

    def __init__(self, expr: str, error_type: str, error: str, status: int | None = None):
        super().__init__(f"{error_type}: {error}")
        self.expr = expr
        self.error_type = error_type
        self.error = error
        self.status = status


class PromQL(Protocol):
    async def query(self, expr: str) -> list[Sample]: ...


def _value(expr: str, pair: Any) -> tuple[float, float]:
    """A [timestamp, "value"] pair; Prometheus writes NaN and ±Inf as strings too."""
    if not isinstance(pair, list) or len(pair) != 2:
        raise PromQLError(expr, "bad_response", f"a sample is not [timestamp, value]: {pair!r}")
    try:
        return float(pair[0]), float(pair[1])
    except (TypeError, ValueError):
        raise PromQLError(expr, "bad_response", f"a sample is not numeric: {pair!r}") from None


def parse_response(expr: str, body: Any) -> list[Sample]:
    """The samples of a decoded `/api/v1/query` answer; PromQLError for an error answer
    or a result that is neither a vector nor a scalar."""
    if not isinstance(body, Mapping):
        raise PromQLError(expr, "bad_response", "the answer is not a JSON object")
    if body.get("status") != "success":
        raise PromQLError(
            expr, str(body.get("errorType") or "unknown"), str(body.get("error") or body)
        )
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise PromQLError(expr, "bad_response", "the answer has no data")
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        ts, value = _value(expr, result)
        return [Sample({}, value, ts)]
    if kind != "vector" or not isinstance(result, list):
        raise PromQLError(expr, "bad_response", f"expected an instant vector, got {kind!r}")
    out = []
    for series in result:
        if not isinstance(series, Mapping):
            raise PromQLError(expr, "bad_response", f"a series is not an object: {series!r}")
        metric = series.get("metric") or {}
        ts, value = _value(expr, series.get("value"))
        out.append(Sample({str(k): str(v) for k, v in metric.items()}, value, ts))
    return out


async def _read_body(resp: aiohttp.ClientResponse) -> bytes:
    """The whole body, up to `MAX_BODY + 1` bytes. One `content.read(n)` returns what has
    arrived so far, not n bytes: a large answer (every pod of a cluster) comes in chunks."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY:
            break
    return b"".join(chunks)


class PrometheusClient:
    """Instant queries against one Prometheus. The session is made on first use, inside
    the running loop, and closed by `close`."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def query(self, expr: str) -> list[Sample]:
        # POST: a PromQL expression can be longer than a URL may be. Prometheus is told the
        # same deadline, so it gives up on its side too.
        form = {"query": expr, "timeout": f"{self.timeout:g}s"}
        try:
            async with self._client().post(f"{self.url}/api/v1/query", data=form) as resp:
                raw = await _read_body(resp)
                status = resp.status
        except TimeoutError:
            raise PromQLError(expr, "timeout", f"no answer within {self.timeout:g}s") from None
        except asyncio.CancelledError:
            raise
        except aiohttp.ClientError as e:
            raise PromQLError(expr, "connection", f"{self.url}: {e}") from None
        if len(raw) > MAX_BODY:
            raise PromQLError(expr, "bad_response", f"answer larger than {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            text = raw[:200].decode("utf-8", "replace")
            raise PromQLError(expr, "http", f"HTTP {status}: {text}", status) from None
        try:
            return parse_response(expr, body)
        except PromQLError as e:
            e.status = status
            raise
