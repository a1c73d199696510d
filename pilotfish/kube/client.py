"""Async API client set-up shared by every long-running part."""

from __future__ import annotations

import os

from kubernetes_asyncio import client, config


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
    return client.ApiClient(configuration=cfg)
