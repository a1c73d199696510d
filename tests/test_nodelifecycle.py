"""Node scheduling taints follow the Ready condition; other owners' taints are kept."""

from __future__ import annotations

from typing import Any

import pytest

from pilotfish.operators.nodelifecycle import (
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    desired_taints,
    taint_patch,
)

OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
NOT_READY = {"key": TAINT_NOT_READY, "effect": "NoSchedule"}
UNREACHABLE = {"key": TAINT_UNREACHABLE, "effect": "NoSchedule"}
EVICT = {"key": TAINT_UNREACHABLE, "effect": "NoExecute"}


def node(ready: str | None, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    conds = [] if ready is None else [{"type": "Ready", "status": ready}]
    spec = {} if taints is None else {"taints": taints}
    return {
        "metadata": {"name": "n", "resourceVersion": "7"},
        "spec": spec,
        "status": {"conditions": conds},
    }


@pytest.mark.parametrize(
    ("ready", "taints", "want"),
    [
        ("True", None, None),
        ("True", [NOT_READY], []),
        ("True", [OTHER, NOT_READY], [OTHER]),
        ("False", None, [NOT_READY]),
        ("False", [NOT_READY], None),
        ("Unknown", [NOT_READY], [UNREACHABLE]),
        (None, [OTHER], [OTHER, UNREACHABLE]),
        ("True", [EVICT], None),  # NoExecute is eviction's, not this rule's
    ],
)
def test_desired_taints(
    ready: str | None, taints: list[dict[str, Any]] | None, want: list[dict[str, Any]] | None
) -> None:
    assert desired_taints(node(ready, taints)) == want


def test_patch_is_conditional_on_the_version_decided_from() -> None:
    ops = taint_patch(node("True", [NOT_READY]), [])
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[1] == {"op": "replace", "path": "/spec/taints", "value": []}
    assert taint_patch(node("False"), [NOT_READY])[1]["op"] == "add"
