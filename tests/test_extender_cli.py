"""`pilotfish extender` hands its flags to the server, the kubeconfig included.

Without `--kubeconfig` reaching `serve`, the local cluster's extender would fall back to
$KUBECONFIG or the in-cluster account and never see the chart's ServiceAccount token.
"""

from __future__ import annotations

import pytest

from pilotfish.cli import main
from pilotfish.extender import server


def test_extender_subcommand_passes_host_port_and_kubeconfig(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, int, str | None]] = []

    async def fake_serve(host: str, port: int, kubeconfig: str | None = None) -> None:
        seen.append((host, port, kubeconfig))

    monkeypatch.setattr(server, "serve", fake_serve)
    args = main.parser().parse_args(
        ["extender", "--host", "127.0.0.1", "--port", "1234", "--kubeconfig", "/tmp/kc"]
    )
    assert args.func(args) == 0
    assert seen == [("127.0.0.1", 1234, "/tmp/kc")]
