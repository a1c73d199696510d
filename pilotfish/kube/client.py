"""The API connection every long-running part makes at start."""

from __future__ import annotations

import os
from pathlib import Path

from pilotfish.kube import credentials
from pilotfish.kube.transport import HttpTransport

# The environment variables through which aiohttp would find a proxy or netrc credentials.
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "WS_PROXY", "WSS_PROXY", "NO_PROXY")


def environment_matters(env: dict[str, str] | None = None, home: Path | None = None) -> bool:
    """Whether a proxy or a netrc file is configured for this process."""
    env = dict(os.environ) if env is None else env
    if any(k in env or k.lower() in env for k in PROXY_ENV) or env.get("NETRC"):
        return True
    return ((home or Path.home()) / ".netrc").exists()


async def api_client(kubeconfig: str | None = None) -> HttpTransport:
    """A transport from an explicit kubeconfig, $KUBECONFIG, or the in-cluster ServiceAccount,
    trusting the environment only when it configures a proxy or netrc (`HttpTransport`)."""
    return HttpTransport(credentials.load(kubeconfig), trust_env=environment_matters())
