"""Async API client set-up shared by every long-running part."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_asyncio import client, config

# The environment variables through which aiohttp would find a proxy or netrc credentials.
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "WS_PROXY", "WSS_PROXY", "NO_PROXY")


def environment_matters(env: dict[str, str] | None = None, home: Path | None = None) -> bool:
    """Whether a proxy or a netrc file is configured for this process."""
    env = dict(os.environ) if env is None else env
    if any(k in env or k.lower() in env for k in PROXY_ENV) or env.get("NETRC"):
        return True
    return ((home or Path.home()) / ".netrc").exists()


def trust_environment(api: client.ApiClient, trust: bool) -> None:
    """kubernetes-asyncio's session trusts the environment, so aiohttp looks up a proxy and
    netrc credentials in a worker thread on every request: two thread hops per request, a
    fifth of the operator's CPU under a batch job's writes (py-spy). With neither
    configured there is nothing to find, so the lookups are turned off (once, at start)."""
    api.rest_client.pool_manager._trust_env = trust


async def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client from an explicit kubeconfig, $KUBECONFIG, or the in-cluster ServiceAccount."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    cfg = client.Configuration()
    if path:
        await config.load_kube_config(config_file=path, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    # The default pool of 4 connections serialises a controller's writes behind its watches.
    cfg.connection_pool_maxsize = 32
    api = client.ApiClient(configuration=cfg)
    trust_environment(api, environment_matters())
    return api
