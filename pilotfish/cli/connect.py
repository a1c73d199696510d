"""The plugin's connection to the cluster: the caller's kubeconfig, context and identity.

The plugin acts as the person running it, never as Pilotfish: what they may read and change
is what their RBAC (and the gate-removal ValidatingAdmissionPolicy) allows, and the API
server's audit log names them. So no credentials are looked up anywhere but the kubeconfig.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from pilotfish.kube.rest import Rest

SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


@dataclass(frozen=True)
class Target:
    """Which cluster, as whom: kubectl's --kubeconfig and --context."""

    kubeconfig: str | None = None
    context: str | None = None


@dataclass(frozen=True)
class Identity:
    """Who the API server says the caller is (a SelfSubjectReview)."""

    username: str
    groups: tuple[str, ...] = ()

    def describe(self) -> str:
        groups = ", ".join(self.groups) if self.groups else "none"
        return f"{self.username} (groups: {groups})"


def _config_file(target: Target) -> str:
    """The kubeconfig path(s) kubectl would read: --kubeconfig, $KUBECONFIG, ~/.kube/config.

    Checked here so a missing file is reported as such, not as a parse error of nothing.
    """
    path = target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if not any(Path(p).expanduser().is_file() for p in path.split(os.pathsep) if p):
        raise config.ConfigException(f"no kubeconfig file at {path}")
    return path


async def rest_client(target: Target) -> Rest:
    """A raw-dict client authenticated exactly as kubectl would be with the same flags."""
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=_config_file(target), context=target.context, client_configuration=cfg
    )
    return Rest(client.ApiClient(configuration=cfg))


def default_namespace(target: Target) -> str:
    """The namespace kubectl would use without -n: the context's, else `default`."""
    try:
        contexts, active = config.list_kube_config_contexts(config_file=_config_file(target))
    except (OSError, config.ConfigException):
        return "default"
    chosen: Any = active
    if target.context:
        chosen = next((c for c in contexts if c.get("name") == target.context), None)
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    return str(ns) if ns else "default"


async def whoami(rest: Rest) -> Identity:
    """The caller's identity as the API server authenticates it (not as the kubeconfig claims).

    Recorded in the manual-release annotation and Event, so it must be the name the audit
    log will show for the same request.
    """
    review = await rest.create(
        SELF_SUBJECT_REVIEWS,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    info = (review.get("status") or {}).get("userInfo") or {}
    return Identity(
        username=str(info.get("username") or "unknown"),
        groups=tuple(str(g) for g in info.get("groups") or ()),
    )
