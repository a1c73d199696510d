"""The plugin's connection to the cluster: the caller's kubeconfig, context and identity.

The plugin acts as the person running it, never as Pilotfish: what they may read and change
is what their RBAC (and the gate-removal ValidatingAdmissionPolicy) allows, and the API
server's audit log names them. So credentials come only from the kubeconfig and from
kubectl's own global flags (`--token`, `--client-certificate`, `--as`...), which a kubectl
plugin is expected to honour exactly as kubectl does: an on-call engineer handed an identity
(`--as oncall --as-group pilotfish:gate-releasers`) acts as that identity.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.kube_config import ConfigNode, KubeConfigLoader, KubeConfigMerger
from multidict import CIMultiDict

from pilotfish.kube.rest import Rest
from pilotfish.kube.transport import query

SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
# A context made up from --cluster/--user when the kubeconfig names no usable one.
FLAGS_CONTEXT = "kubectl-pilotfish-flags"


@dataclass(frozen=True)
class Target:
    """Which cluster, as whom: kubectl's global connection and impersonation flags."""

    kubeconfig: str | None = None
    context: str | None = None
    cluster: str | None = None
    user: str | None = None
    namespace: str | None = None
    server: str | None = None
    token: str | None = None
    certificate_authority: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    insecure_skip_tls_verify: bool = False
    request_timeout: float = 0.0
    impersonate: str | None = None
    impersonate_groups: tuple[str, ...] = ()
    impersonate_uid: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Target:
        """The target the parsed flags name (flags never given read as unset)."""
        get = vars(args).get
        return cls(
            kubeconfig=get("kubeconfig"),
            context=get("context"),
            cluster=get("cluster"),
            user=get("user"),
            namespace=get("namespace"),
            server=get("server"),
            token=get("token"),
            certificate_authority=get("certificate_authority"),
            client_certificate=get("client_certificate"),
            client_key=get("client_key"),
            insecure_skip_tls_verify=bool(get("insecure_skip_tls_verify")),
            request_timeout=float(get("request_timeout") or 0.0),
            impersonate=get("as_user"),
            impersonate_groups=tuple(get("as_group") or ()),
            impersonate_uid=get("as_uid"),
        )

    def impersonation_headers(self) -> list[tuple[str, str]]:
        """The Impersonate-* headers kubectl sends for --as, --as-group and --as-uid.

        Groups are one header each (the API server reads every value; a comma-joined
        value would be one group with a comma in its name).
        """
        if self.impersonate is None:
            if self.impersonate_groups or self.impersonate_uid:
                raise ValueError(
                    "--as-group and --as-uid need --as: the API server impersonates groups "
                    "and a UID only together with a user"
                )
            return []
        headers = [("Impersonate-User", self.impersonate)]
        headers += [("Impersonate-Group", g) for g in self.impersonate_groups]
        if self.impersonate_uid:
            headers.append(("Impersonate-Uid", self.impersonate_uid))
        return headers


@dataclass(frozen=True)
class Identity:
    """Who the API server says the caller is (a SelfSubjectReview)."""

    username: str
    groups: tuple[str, ...] = ()

    def describe(self) -> str:
        groups = ", ".join(self.groups) if self.groups else "none"
        return f"{self.username} (groups: {groups})"


def _request_timeout(text: str) -> float:
    from pilotfish.cli.rollout_cmd import parse_duration  # it imports this module

    return parse_duration(text)


def add_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """kubectl's global flags (its genericclioptions set), before or after the subcommand.

    Below the top level they default to SUPPRESS so a flag given before the subcommand is
    not overwritten by the subcommand's own default.
    """

    def flag(*names: str, **kw: Any) -> None:
        if not top:
            kw["default"] = argparse.SUPPRESS
        parser.add_argument(*names, **kw)

    flag("--kubeconfig", help="path to the kubeconfig file")
    flag("--context", help="the kubeconfig context to use")
    flag("--cluster", help="the kubeconfig cluster to use (instead of the context's)")
    flag("--user", help="the kubeconfig user to use (instead of the context's)")
    flag("-n", "--namespace", help="namespace (default: the context's)")
    flag("-s", "--server", help="the API server's address and port")
    flag("--token", help="bearer token for authentication to the API server")
    flag("--certificate-authority", help="path to a CA bundle to verify the API server with")
    flag("--client-certificate", help="path to a client certificate for TLS")
    flag("--client-key", help="path to the client certificate's key")
    flag(
        "--insecure-skip-tls-verify",
        action="store_true",
        help="do not verify the API server's certificate (insecure)",
    )
    flag(
        "--request-timeout",
        type=_request_timeout,
        metavar="DURATION",
        help="give up on one request after this long (e.g. 30s, 1m; 0: the default limits)",
    )
    flag("--as", dest="as_user", metavar="USER", help="impersonate this user for the request")
    flag(
        "--as-group",
        action="append",
        metavar="GROUP",
        help="impersonate this group too (repeatable; needs --as)",
    )
    flag("--as-uid", metavar="UID", help="impersonate this UID too (needs --as)")


def _config_file(target: Target) -> str:
    """The kubeconfig path(s) kubectl would read: --kubeconfig, $KUBECONFIG, ~/.kube/config.

    Checked here so a missing file is reported as such, not as a parse error of nothing.
    """
    path = target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if not any(Path(p).expanduser().is_file() for p in path.split(os.pathsep) if p):
        raise config.ConfigException(f"no kubeconfig file at {path}")
    return path


def _loader(target: Target) -> KubeConfigLoader:
    """The kubeconfig's chosen context, its cluster and user replaced as --cluster/--user say."""
    merged = KubeConfigMerger(_config_file(target)).config
    if merged is None:
        raise config.ConfigException("the kubeconfig is empty")
    name = target.context or merged.value.get("current-context")
    if target.cluster or target.user:
        contexts: list[Any] = merged.value.setdefault("contexts", [])
        index = next(
            (i for i, c in enumerate(contexts) if name and c["name"] == name),
            None,
        )
        node = contexts[index] if index is not None else None
        inner = dict(node.value.get("context") or {}) if node is not None else {}
        if target.cluster:
            inner["cluster"] = target.cluster
        if target.user:
            inner["user"] = target.user
        value = {"name": name or FLAGS_CONTEXT, "context": inner}
        replacement = ConfigNode(f"context {value['name']}", value, merged.path)
        if index is None:
            contexts.append(replacement)
            name = str(value["name"])
        else:
            contexts[index] = replacement
    if not name:
        raise config.ConfigException("the kubeconfig has no current-context; pass --context")
    return KubeConfigLoader(config_dict=merged, config_base_path=None, active_context=name)


async def configuration(target: Target) -> client.Configuration:
    """The client configuration kubectl would build from the same kubeconfig and flags."""
    cfg = client.Configuration()
    if target.server and target.kubeconfig is None and not _any_kubeconfig():
        cfg.host = target.server.rstrip("/")  # kubectl needs no kubeconfig given --server
    else:
        await _loader(target).load_and_set(cfg)
    if target.server:
        cfg.host = target.server.rstrip("/")
    if target.token:
        cfg.api_key["BearerToken"] = f"Bearer {target.token}"
    if target.certificate_authority:
        cfg.ssl_ca_cert = target.certificate_authority
    if target.client_certificate:
        cfg.cert_file = target.client_certificate
    if target.client_key:
        cfg.key_file = target.client_key
    if target.insecure_skip_tls_verify:
        cfg.verify_ssl = False
    return cfg


def _any_kubeconfig() -> bool:
    try:
        _config_file(Target())
    except config.ConfigException:
        return False
    return True


class ConnectedApiClient(client.ApiClient):  # type: ignore[misc]
    """An ApiClient that adds the Impersonate-* headers (repeated ones too) and kubectl's
    --request-timeout to every request, whichever API the request comes from."""

    def __init__(
        self,
        configuration: client.Configuration,
        headers: list[tuple[str, str]],
        request_timeout: float = 0.0,
    ) -> None:
        super().__init__(configuration=configuration)
        self.extra_headers = headers
        self.request_timeout = request_timeout

    async def request(
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        **kw: Any,
    ) -> Any:
        merged: CIMultiDict[str] = CIMultiDict(headers or {})
        for name, value in self.extra_headers:
            merged.add(name, value)
        if self.request_timeout:
            kw["_request_timeout"] = self.request_timeout
        return await super().request(method, url, query_params=query_params, headers=merged, **kw)

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None,
        headers: dict[str, str],
        body: Any,
        request_timeout: float | None,
    ) -> Any:
        """`pilotfish.kube.transport.Transport` over this client (see `Rest`)."""
        return await self.call_api(
            path,
            method,
            query_params=query(params),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=request_timeout,
        )


async def rest_client(target: Target) -> Rest:
    """A raw-dict client authenticated exactly as kubectl would be with the same flags."""
    headers = target.impersonation_headers()
    cfg = await configuration(target)
    return Rest(ConnectedApiClient(cfg, headers, target.request_timeout))


def default_namespace(target: Target) -> str:
    """The namespace kubectl would use: -n, else the context's, else `default`."""
    if target.namespace:
        return target.namespace
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
    log will show for the same request (with --as, the impersonated user).
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
