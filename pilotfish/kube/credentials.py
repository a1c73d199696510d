"""Where a long-running part finds the API server and how it proves who it is.

Pilotfish's components read one kubeconfig context or the in-cluster ServiceAccount, the two
forms their deployments give them (the chart: in-cluster; `pilotfish dev`: a kubeconfig per
component). Reading them here rather than through kubernetes-asyncio's loader keeps that
package out of the components altogether: importing it loads its ~850 generated modules, 37
MB of resident memory in every process (measured), for one function. Exec and
auth-provider users are refused by name: a component has no terminal to run a login in.
The kubectl plugin, which must read any kubeconfig kubectl reads, keeps kubernetes-asyncio.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A projected ServiceAccount token is rotated by the kubelet well before it expires; client-go
# reads the file again at most once a minute.
TOKEN_FILE_REREAD_SECONDS: Final = 60.0


class CredentialsError(Exception):
    """The kubeconfig or the in-cluster environment does not say how to reach the API."""


@dataclass
class Credentials:
    server: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    cert_file: str | None = None
    cert_data: bytes | None = None
    key_file: str | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    proxy: str | None = None
    _read_at: float = field(default=-TOKEN_FILE_REREAD_SECONDS, repr=False)

    def bearer(self, now: float | None = None, *, fresh: bool = False) -> str | None:
        """The token to send: the kubeconfig's, else the token file's, read again each
        minute or when `fresh` (a rotated ServiceAccount token is picked up)."""
        if self.token_file:
            now = time.monotonic() if now is None else now
            stale = now - self._read_at >= TOKEN_FILE_REREAD_SECONDS
            if self.token is None or stale or fresh:
                self.token = Path(self.token_file).read_text().strip()
                self._read_at = now
        return self.token

    def ssl_context(self) -> ssl.SSLContext | None:
        """None for plain http; client certificates and CA data held in memory are written
        to private temporary files only for the moment `ssl` loads them."""
        if not self.server.startswith("https://"):
            return None
        ctx = ssl.create_default_context()
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_data is not None:
            ctx.load_verify_locations(cadata=self.ca_data.decode())
        elif self.ca_file:
            ctx.load_verify_locations(cafile=self.ca_file)
        if self.cert_file or self.cert_data is not None:
            with (
                _as_file(self.cert_data, self.cert_file) as cert,
                _as_file(self.key_data, self.key_file) as key,
            ):
                if cert is None:
                    raise CredentialsError("a client key without a client certificate")
                ctx.load_cert_chain(cert, key)
        return ctx


@contextmanager
def _as_file(data: bytes | None, path: str | None) -> Iterator[str | None]:
    """`path`, or `data` in a private temporary file removed on exit."""
    if data is None:
        yield path
        return
    fd, name = tempfile.mkstemp(prefix="pilotfish-cred-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield name
    finally:
        os.unlink(name)


def _named(items: Any, name: str, what: str, path: Path) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            body = item.get(what)
            return body if isinstance(body, dict) else {}
    raise CredentialsError(f"{path}: no {what} named {name!r}")


def _data(body: dict[str, Any], key: str, path: Path) -> bytes | None:
    raw = body.get(f"{key}-data")
    if raw is None:
        return None
    try:
        return base64.b64decode(str(raw), validate=True)
    except ValueError as e:
        raise CredentialsError(f"{path}: {key}-data is not base64: {e}") from None


def _file(body: dict[str, Any], key: str, base: Path) -> str | None:
    value = body.get(key)
    if not value:
        return None
    p = Path(str(value)).expanduser()
    return str(p if p.is_absolute() else base / p)


def from_kubeconfig(path: str | Path, context: str | None = None) -> Credentials:
    """The credentials of `context` (default: current-context) of one kubeconfig file;
    relative file names are relative to the file, as kubectl reads them."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise CredentialsError(f"cannot read kubeconfig {path}: {e}") from None
    if not isinstance(doc, dict):
        raise CredentialsError(f"{path}: not a kubeconfig")
    name = context or doc.get("current-context")
    if not name:
        raise CredentialsError(f"{path}: no current-context")
    ctx = _named(doc.get("contexts"), str(name), "context", path)
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user = _named(doc.get("users"), str(ctx.get("user")), "user", path) if ctx.get("user") else {}
    for unsupported in ("exec", "auth-provider", "username"):
        if unsupported in user:
            raise CredentialsError(
                f"{path}: user {ctx.get('user')!r} authenticates with {unsupported!r}, which "
                "Pilotfish's components do not run; give it a token, a tokenFile or a client "
                "certificate"
            )
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise CredentialsError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    base = path.parent
    return Credentials(
        server=server,
        ca_file=_file(cluster, "certificate-authority", base),
        ca_data=_data(cluster, "certificate-authority", path),
        cert_file=_file(user, "client-certificate", base),
        cert_data=_data(user, "client-certificate", path),
        key_file=_file(user, "client-key", base),
        key_data=_data(user, "client-key", path),
        token=str(user["token"]) if user.get("token") else None,
        token_file=_file(user, "tokenFile", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        proxy=str(cluster["proxy-url"]) if cluster.get("proxy-url") else None,
    )


def in_cluster(env: dict[str, str] | None = None, root: Path = SERVICE_ACCOUNT) -> Credentials:
    """The pod's ServiceAccount: the API's Service address from the environment, its CA and
    its (rotated) token from the mounted files."""
    env = dict(os.environ) if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise CredentialsError(
            "no kubeconfig given and not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset); "
            "pass --kubeconfig or set KUBECONFIG"
        )
    if ":" in host:
        host = f"[{host}]"
    token = root / "token"
    if not token.exists():
        raise CredentialsError(f"in-cluster: no ServiceAccount token at {token}")
    return Credentials(
        server=f"https://{host}:{port}", ca_file=str(root / "ca.crt"), token_file=str(token)
    )


def load(kubeconfig: str | None = None) -> Credentials:
    """An explicit kubeconfig, else $KUBECONFIG (its first file), else in-cluster."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return from_kubeconfig(path) if path else in_cluster()
