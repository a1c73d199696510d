"""One process's connections to the API server: an aiohttp session over its credentials.

`Rest` speaks to the API through a `Transport`; components get an `HttpTransport` (its own
session, its own pool), the kubectl plugin one over kubernetes-asyncio's ApiClient (it reads
any kubeconfig kubectl reads: `pilotfish.cli.connect`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

import aiohttp
import orjson

from pilotfish.kube.credentials import Credentials

# The default of 4 connections (kubernetes-asyncio's) serialised a controller's writes
# behind its watches.
POOL_SIZE: Final = 32


class Transport(Protocol):
    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None,
        headers: dict[str, str],
        body: Any,
        request_timeout: float | None,
    ) -> aiohttp.ClientResponse:
        """The answer, its body not yet read (the caller reads or releases it)."""
        ...

    async def close(self) -> None: ...


def encode(body: Any) -> bytes | None:
    """A request body: bytes and text as they are (YAML for apply), anything else as JSON."""
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return orjson.dumps(body)


def query(params: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """Query parameters as the API reads them (booleans `true`/`false`)."""
    out = []
    for k, v in (params or {}).items():
        out.append((k, ("true" if v else "false") if isinstance(v, bool) else str(v)))
    return out


class HttpTransport:
    """`trust_env`: let aiohttp look up proxies and netrc credentials in the environment; it
    does so in a worker thread on every request, a fifth of the operator's CPU under a batch
    job's writes (py-spy), so only when the process has any (`pilotfish.kube.client`)."""

    def __init__(
        self, credentials: Credentials, *, pool: int = POOL_SIZE, trust_env: bool = False
    ) -> None:
        self.credentials = credentials
        self.trust_env = trust_env
        self.pool = pool
        self._ssl = credentials.ssl_context()
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop (aiohttp binds a session to it).
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.pool, ssl=self._ssl or False)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=self.trust_env)
        return self._session

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None,
        headers: dict[str, str],
        body: Any,
        request_timeout: float | None,
    ) -> aiohttp.ClientResponse:
        c = self.credentials
        token = c.bearer()
        if token:
            headers = {**headers, "Authorization": f"Bearer {token}"}
        extra: dict[str, Any] = {}
        if c.proxy:
            extra["proxy"] = c.proxy
        if c.tls_server_name:
            extra["server_hostname"] = c.tls_server_name
        return await self._client().request(
            method,
            c.server + path,
            params=query(params),
            headers=headers,
            data=encode(body),
            timeout=aiohttp.ClientTimeout(total=request_timeout),
            **extra,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
