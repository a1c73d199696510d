"""The shared API client does not look up proxies and netrc credentials per request when the
process has none configured, and still does when it has; a refusal carries the Retry-After
the server asked for, from API Priority and Fairness's plain-text 429 as from a Status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.helpers import get_env_proxy_for_url
from aiohttp.test_utils import TestServer

from pilotfish.kube.client import api_client, environment_matters
from pilotfish.kube.rest import ApiError, Rest


def test_the_environment_matters_only_with_a_proxy_or_netrc(tmp_path: Path) -> None:
    assert not environment_matters({}, tmp_path)
    assert environment_matters({"HTTPS_PROXY": "http://proxy:3128"}, tmp_path)
    assert environment_matters({"no_proxy": "10.0.0.0/8"}, tmp_path)
    assert environment_matters({"NETRC": str(tmp_path / "n")}, tmp_path)
    (tmp_path / ".netrc").write_text("machine api login a password b\n")
    assert environment_matters({}, tmp_path)


def kubeconfig_for(tmp_path: Path, port: int | None) -> str:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return str(kubeconfig)


async def requests_looking_up_proxies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> int:
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "NETRC"):
        monkeypatch.delenv(k, raising=False)
        monkeypatch.delenv(k.lower(), raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    lookups: list[Any] = []

    def counting(url: Any) -> Any:
        lookups.append(url)
        return get_env_proxy_for_url(url)

    # aiohttp's client module looks it up by this name on each request.
    monkeypatch.setattr("aiohttp.client.get_env_proxy_for_url", counting)
    app = web.Application()

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"gitVersion": "v1"})

    app.router.add_get("/version", version)
    async with TestServer(app) as server:
        api = await api_client(kubeconfig_for(tmp_path, server.port))
        try:
            for _ in range(3):
                assert await Rest(api).get("/version") == {"gitVersion": "v1"}
        finally:
            await api.close()
    return len(lookups)


async def test_no_per_request_environment_lookups_without_a_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await requests_looking_up_proxies(tmp_path, monkeypatch, {}) == 0


async def test_a_configured_proxy_is_still_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NO_PROXY for the test server's address: aiohttp looks the proxy up and then bypasses it.
    env = {"HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1"}
    assert await requests_looking_up_proxies(tmp_path, monkeypatch, env) == 3


async def test_a_refusal_carries_the_retry_after_the_server_asked_for(tmp_path: Path) -> None:
    async def flow_control(_: web.Request) -> web.Response:
        # As API Priority and Fairness refuses: plain text, the wait in the header only.
        return web.Response(
            status=429, text="Too many requests, please try again later.\n",
            headers={"Retry-After": "1"},
        )  # fmt: skip

    async def admission(_: web.Request) -> web.Response:
        status = {"kind": "Status", "reason": "TooManyRequests", "message": "team a: slow down"}
        return web.json_response(status, status=429, headers={"Retry-After": "3"})

    async def conflict(_: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "reason": "Conflict"}, status=409)

    app = web.Application()
    app.router.add_post("/apf", flow_control)
    app.router.add_post("/admission", admission)
    app.router.add_post("/conflict", conflict)
    async with TestServer(app) as server:
        api = await api_client(kubeconfig_for(tmp_path, server.port))
        try:
            rest = Rest(api)
            seen = {}
            for path in ("/apf", "/admission", "/conflict"):
                with pytest.raises(ApiError) as refused:
                    await rest.create(path, {})
                seen[path] = (refused.value.status, refused.value.reason, refused.value.retry_after)
        finally:
            await api.close()
    assert seen == {
        "/apf": (429, "Unknown", 1.0),
        "/admission": (429, "TooManyRequests", 3.0),
        "/conflict": (409, "Conflict", None),
    }
