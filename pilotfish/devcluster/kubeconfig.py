"""Kubeconfig files for the local control plane: certificate identities and token identities."""

from __future__ import annotations

from pathlib import Path

import yaml


def write(
    path: Path,
    server: str,
    ca_cert: Path,
    user: str,
    *,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    """Write a one-context kubeconfig; exactly one of a client cert pair or a token."""
    if (client_cert is None) == (token is None):
        raise ValueError("give either client_cert/client_key or token")
    creds: dict[str, str] = (
        {"token": token}
        if token is not None
        else {"client-certificate": str(client_cert), "client-key": str(client_key)}
    )
    context: dict[str, str] = {"cluster": "pilotfish", "user": user}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "pilotfish",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "pilotfish", "context": context}],
        "current-context": "pilotfish",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
