"""`kubectl pilotfish` honours kubectl's global flags, and sends what they say on the wire.

Parsing is checked through the plugin's own parser; the client configuration through a
kubeconfig written here; impersonation and tokens by pointing the plugin's client at a
loopback HTTP server that records the headers of each request it gets.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio.config import ConfigException

from pilotfish.cli import connect, kubectl_plugin
from pilotfish.cli.connect import Target

FLAGS = [
    "--kubeconfig=k",
    "--context=c",
    "--cluster=cl",
    "--user=u",
    "-n=ns",
    "--server=https://x:6443",
    "--token=t0k",
    "--certificate-authority=ca.crt",
    "--client-certificate=me.crt",
    "--client-key=me.key",
    "--insecure-skip-tls-verify",
    "--request-timeout=1m30s",
    "--as=alice",
    "--as-group=g1",
    "--as-group=g2",
    "--as-uid=42",
]
EXPECTED = Target(
    kubeconfig="k",
    context="c",
    cluster="cl",
    user="u",
    namespace="ns",
    server="https://x:6443",
    token="t0k",
    certificate_authority="ca.crt",
    client_certificate="me.crt",
    client_key="me.key",
    insecure_skip_tls_verify=True,
    request_timeout=90.0,
    impersonate="alice",
    impersonate_groups=("g1", "g2"),
    impersonate_uid="42",
)


def target(argv: list[str]) -> Target:
    return Target.from_args(kubectl_plugin.parser().parse_args(argv))


@pytest.mark.parametrize(
    "argv",
    [
        [*FLAGS, "gates", "-A"],
        ["gates", *FLAGS, "-A"],
        ["gates", "release", "p", "g", "--reason", "r", *FLAGS],
        ["why", "p", *FLAGS],
        ["rollout", "status", "sw", *FLAGS],
        ["status", *FLAGS],
    ],
)
def test_every_global_flag_is_taken_before_or_after_the_subcommand(argv: list[str]) -> None:
    assert target(argv) == EXPECTED


def test_flags_before_the_subcommand_survive_a_subcommand_that_does_not_repeat_them() -> None:
    t = target(
        [
            "--as",
            "bob",
            "--as-group",
            "ops",
            "-s",
            "https://y",
            "gates",
            "cancel",
            "p",
            "--reason",
            "r",
        ]
    )
    assert (t.impersonate, t.impersonate_groups, t.server) == ("bob", ("ops",), "https://y")
    assert target(["gates"]) == Target()


def test_impersonation_headers_repeat_one_header_per_group() -> None:
    assert EXPECTED.impersonation_headers() == [
        ("Impersonate-User", "alice"),
        ("Impersonate-Group", "g1"),
        ("Impersonate-Group", "g2"),
        ("Impersonate-Uid", "42"),
    ]
    assert Target().impersonation_headers() == []


def test_groups_without_a_user_are_a_usage_error_naming_the_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        kubectl_plugin.main(["--as-group", "pilotfish:gate-releasers", "gates"])
    assert exit_.value.code == 2
    assert "--as-group and --as-uid need --as" in capsys.readouterr().err


def test_a_bad_request_timeout_is_refused_naming_the_value() -> None:
    with pytest.raises(SystemExit):
        kubectl_plugin.parser().parse_args(["gates", "--request-timeout", "soon"])


# -- the client configuration --------------------------------------------------------------


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    (tmp_path / "ca-a.crt").write_text("a")
    (tmp_path / "ca-b.crt").write_text("b")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "a",
        "clusters": [
            {
                "name": "ca",
                "cluster": {"server": "https://a:1", "certificate-authority": "ca-a.crt"},
            },
            {
                "name": "cb",
                "cluster": {"server": "https://b:2", "certificate-authority": "ca-b.crt"},
            },
        ],
        "users": [
            {"name": "ua", "user": {"token": "token-a"}},
            {"name": "ub", "user": {"token": "token-b"}},
        ],
        "contexts": [
            {"name": "a", "context": {"cluster": "ca", "user": "ua", "namespace": "team-a"}},
            {"name": "b", "context": {"cluster": "cb", "user": "ub"}},
        ],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_the_current_context_by_default_and_context_picks_another(kubeconfig: Path) -> None:
    cfg = await connect.configuration(Target(kubeconfig=str(kubeconfig)))
    assert cfg.host == "https://a:1"
    assert cfg.api_key["BearerToken"] == "Bearer token-a"
    assert Path(cfg.ssl_ca_cert) == kubeconfig.parent / "ca-a.crt"
    cfg = await connect.configuration(Target(kubeconfig=str(kubeconfig), context="b"))
    assert (cfg.host, cfg.api_key["BearerToken"]) == ("https://b:2", "Bearer token-b")


async def test_cluster_and_user_replace_the_contexts_own(kubeconfig: Path) -> None:
    cfg = await connect.configuration(Target(kubeconfig=str(kubeconfig), cluster="cb"))
    assert (cfg.host, cfg.api_key["BearerToken"]) == ("https://b:2", "Bearer token-a")
    cfg = await connect.configuration(Target(kubeconfig=str(kubeconfig), user="ub"))
    assert (cfg.host, cfg.api_key["BearerToken"]) == ("https://a:1", "Bearer token-b")


async def test_explicit_flags_override_the_kubeconfig(kubeconfig: Path) -> None:
    cfg = await connect.configuration(
        Target(
            kubeconfig=str(kubeconfig),
            server="https://elsewhere:6443/",
            token="t0k",
            certificate_authority="/ca.crt",
            client_certificate="/me.crt",
            client_key="/me.key",
            insecure_skip_tls_verify=True,
        )
    )
    assert cfg.host == "https://elsewhere:6443"
    assert cfg.api_key["BearerToken"] == "Bearer t0k"
    assert (cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file) == ("/ca.crt", "/me.crt", "/me.key")
    assert cfg.verify_ssl is False


async def test_server_and_token_work_without_any_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = await connect.configuration(Target(server="https://s:1", token="t"))
    assert (cfg.host, cfg.api_key["BearerToken"]) == ("https://s:1", "Bearer t")
    with pytest.raises(ConfigException, match="no kubeconfig file at"):
        await connect.configuration(Target(token="t"))


def test_namespace_flag_then_the_contexts_then_default(kubeconfig: Path) -> None:
    k = str(kubeconfig)
    assert connect.default_namespace(Target(kubeconfig=k, namespace="x")) == "x"
    assert connect.default_namespace(Target(kubeconfig=k)) == "team-a"
    assert connect.default_namespace(Target(kubeconfig=k, context="b")) == "default"


# -- on the wire -----------------------------------------------------------------------------


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[str, list[Any]]]:
    """A loopback API server answering SelfSubjectReviews with the headers it was sent."""
    seen: list[Any] = []

    async def review(request: web.Request) -> web.Response:
        seen.append(request.headers)
        user = request.headers.get("Impersonate-User", "admin")
        groups = request.headers.getall("Impersonate-Group", [])
        return web.json_response({"status": {"userInfo": {"username": user, "groups": groups}}})

    app = web.Application()
    app.router.add_post(connect.SELF_SUBJECT_REVIEWS, review)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_as_and_as_group_reach_the_api_server_as_impersonation_headers(
    recorder: tuple[str, list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = recorder
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    args = kubectl_plugin.parser().parse_args(
        [
            *("gates", "-s", url, "--token", "t0k", "--as", "oncall"),
            *("--as-group", "g1", "--as-group", "g2", "--as-uid", "7"),
        ]
    )
    rest = await connect.rest_client(Target.from_args(args))
    try:
        me = await connect.whoami(rest)
    finally:
        await rest.api.close()
    assert me == connect.Identity("oncall", ("g1", "g2"))
    (headers,) = seen
    assert headers["Authorization"] == "Bearer t0k"
    assert headers.getall("Impersonate-Group") == ["g1", "g2"]
    assert headers["Impersonate-Uid"] == "7"


async def test_without_as_no_impersonation_header_is_sent(
    recorder: tuple[str, list[Any]],
) -> None:
    url, seen = recorder
    rest = await connect.rest_client(Target(server=url, token="t"))
    try:
        assert (await connect.whoami(rest)).username == "admin"
    finally:
        await rest.api.close()
    assert not any(h.lower().startswith("impersonate-") for h in seen[0])


def test_from_args_reads_an_empty_namespace_as_unset() -> None:
    assert Target.from_args(argparse.Namespace()) == Target()
