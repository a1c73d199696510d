"""Band resolution, contradiction messages and the priority patch."""

from __future__ import annotations

from typing import Any

import pytest

from pilotfish.webhooks.bands import BandChoice, patch, problem, resolve


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p"}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "x"}], **spec}}


@pytest.mark.parametrize(
    ("labels", "ns_labels", "want"),
    [
        (
            {"pilotfish.io/band": "batch"},
            {"pilotfish.io/band": "production"},
            BandChoice("batch", "pod label"),
        ),
        ({}, {"pilotfish.io/band": "best-effort"}, BandChoice("best-effort", "namespace default")),
        ({}, {}, None),
    ],
)
def test_resolve(
    labels: dict[str, str], ns_labels: dict[str, str], want: BandChoice | None
) -> None:
    assert resolve(pod(labels), ns_labels) == want


def test_contradicting_priority_class_is_named() -> None:
    msg = problem(pod(priorityClassName="pilotfish-production"), BandChoice("batch", "pod label"))
    assert msg == (
        "spec.priorityClassName 'pilotfish-production' contradicts the pod's band 'batch' "
        "(from the pod label pilotfish.io/band): batch pods run at 'pilotfish-batch'"
    )
    assert (
        problem(pod(priorityClassName="pilotfish-batch"), BandChoice("batch", "pod label")) is None
    )
    assert "not one of" in (problem(pod(), BandChoice("gold", "pod label")) or "")


def test_patch_sets_class_label_scheduler_and_clears_the_computed_priority() -> None:
    p = pod(None, priority=0, preemptionPolicy="PreemptLowerPriority")
    ops = patch(p, BandChoice("production", "namespace default"), "pilotfish-scheduler")
    assert ops == [
        {"op": "add", "path": "/metadata/labels", "value": {}},
        {"op": "add", "path": "/metadata/labels/pilotfish.io~1band", "value": "production"},
        {"op": "add", "path": "/spec/priorityClassName", "value": "pilotfish-production"},
        {"op": "remove", "path": "/spec/priority"},
        {"op": "remove", "path": "/spec/preemptionPolicy"},
        {"op": "add", "path": "/spec/schedulerName", "value": "pilotfish-scheduler"},
    ]


def test_patch_is_empty_when_already_right() -> None:
    p = pod(
        {"pilotfish.io/band": "batch"}, priorityClassName="pilotfish-batch", schedulerName="custom"
    )
    assert patch(p, BandChoice("batch", "pod label"), "pilotfish-scheduler") == []
