"""Every Pilotfish listener binds to loopback unless told otherwise (the chart passes the pod
IP): nothing is reachable from other hosts by default."""

from __future__ import annotations

import os

import pytest

from pilotfish.cli.main import parser


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["operator"], "metrics_host"),
        (["extender"], "host"),
        (["webhooks", "--cert", "c.pem", "--key", "k.pem"], "host"),
    ],
)
def test_listeners_default_to_loopback(argv: list[str], field: str) -> None:
    assert getattr(parser().parse_args(argv), field) == "127.0.0.1"


def test_an_explicit_address_is_kept() -> None:
    args = parser().parse_args(["operator", "--metrics-host=10.1.2.3"])
    assert args.metrics_host == "10.1.2.3"


def test_operator_identity_defaults_to_the_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from pilotfish.operators import runner

    monkeypatch.setenv("POD_NAME", "pilotfish-operator-7d9f-abcde")
    assert runner.default_identity() == "pilotfish-operator-7d9f-abcde"
    monkeypatch.delenv("POD_NAME")
    assert runner.default_identity().endswith(f"-{os.getpid()}"), "host and pid"
    assert parser().parse_args(["operator", "--identity", "x"]).identity == "x"
