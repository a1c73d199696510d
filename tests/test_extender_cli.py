"""`pilotfish extender` hands its flags to the server, the kubeconfig and TLS included.

Without `--kubeconfig` reaching `serve`, the local cluster's extender would fall back to
$KUBECONFIG or the in-cluster account and never see the chart's ServiceAccount token;
without `--client-ca` it would serve anyone who reaches its port.
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from pilotfish.cli import main
from pilotfish.extender import server


def test_extender_subcommand_passes_host_port_and_kubeconfig(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, int, str | None, server.Tls | None, int | None]] = []

    async def fake_serve(
        host: str,
        port: int,
        kubeconfig: str | None = None,
        *,
        tls: server.Tls | None = None,
        health_port: int | None = None,
    ) -> None:
        seen.append((host, port, kubeconfig, tls, health_port))

    monkeypatch.setattr(server, "serve", fake_serve)
    args = main.parser().parse_args(
        ["extender", "--host", "127.0.0.1", "--port", "1234", "--kubeconfig", "/tmp/kc"]
    )
    assert args.func(args) == 0
    assert seen == [("127.0.0.1", 1234, "/tmp/kc", None, None)]
    args = main.parser().parse_args(
        [
            "extender",
            "--host=127.0.0.1",
            "--port=1234",
            "--cert=/c/tls.crt",
            "--key=/c/tls.key",
            "--client-ca=/c/ca.crt",
            "--health-port=8081",
        ]
    )
    assert args.func(args) == 0
    assert seen[-1] == (
        "127.0.0.1",
        1234,
        None,
        server.Tls("/c/tls.crt", "/c/tls.key", "/c/ca.crt"),
        8081,
    )


def test_extender_serves_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler waits on every call, and the loop and TLS around a call cost more than
    the handler: the extender process runs on uvloop's, not asyncio's own."""
    loops: list[asyncio.AbstractEventLoop] = []

    async def fake_serve(*_args: object, **_kwargs: object) -> None:
        loops.append(asyncio.get_running_loop())

    monkeypatch.setattr(server, "serve", fake_serve)
    args = main.parser().parse_args(["extender", "--port", "1234"])
    assert args.func(args) == 0
    assert len(loops) == 1 and isinstance(loops[0], uvloop.Loop)


@pytest.mark.parametrize(
    "flags",
    [["--cert=/c/tls.crt"], ["--key=/c/tls.key"], ["--client-ca=/c/ca.crt"]],
)
def test_extender_refuses_half_a_tls_configuration(
    monkeypatch: pytest.MonkeyPatch, flags: list[str]
) -> None:
    async def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("must not serve")

    monkeypatch.setattr(server, "serve", never)
    args = main.parser().parse_args(["extender", *flags])
    assert args.func(args) == 2
