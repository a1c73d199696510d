"""Band resolution, the class rules and their messages, and the priority patch."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from pilotfish.webhooks.bands import BandChoice, class_problem, patch, problem, resolve

SW_OWNER = {"kind": "ServiceWorkload", "name": "web", "controller": True, "uid": "u"}


def pod(labels: dict[str, str] | None = None, owner: bool = False, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p"}
    if labels is not None:
        meta["labels"] = labels
    if owner:
        meta["ownerReferences"] = [SW_OWNER]
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "x"}], **spec}}


@pytest.mark.parametrize(
    ("p", "ns_labels", "want"),
    [
        (
            pod({"pilotfish.io/band": "batch"}, priorityClassName="pilotfish-production"),
            {"pilotfish.io/band": "production"},
            BandChoice("batch", "pod label pilotfish.io/band"),
        ),
        (
            pod({"pilotfish.io/band": "production"}, owner=True),
            {},
            BandChoice(
                "production", "pod label pilotfish.io/band, written by its ServiceWorkload web"
            ),
        ),
        (
            pod({}, priorityClassName="pilotfish-production"),
            {"pilotfish.io/band": "best-effort"},
            BandChoice(
                "best-effort", "namespace default (label pilotfish.io/band of namespace shop)"
            ),
        ),
        (
            pod(None, priorityClassName="pilotfish-production"),
            {},
            BandChoice("production", "spec.priorityClassName"),
        ),
        (pod({}), {}, BandChoice("batch", "default for pods that name no band")),
        (
            pod({}, priorityClassName="system-cluster-critical"),
            {},
            BandChoice("batch", "default for pods that name no band"),
        ),
    ],
)
def test_resolve_label_then_workload_then_namespace_then_class_then_batch(
    p: dict[str, Any], ns_labels: dict[str, str], want: BandChoice
) -> None:
    assert resolve(p, "shop", ns_labels) == want


def test_contradicting_priority_class_is_named() -> None:
    choice = BandChoice("batch", "pod label pilotfish.io/band")
    msg = problem(pod(priorityClassName="pilotfish-production"), choice)
    assert msg == (
        "spec.priorityClassName 'pilotfish-production' contradicts the pod's band 'batch' "
        "(from the pod label pilotfish.io/band): batch pods run at 'pilotfish-batch'"
    )
    assert problem(pod(priorityClassName="pilotfish-batch"), choice) is None
    assert problem(pod(), BandChoice("gold", "pod label pilotfish.io/band")) == (
        "band 'gold' (from the pod label pilotfish.io/band) is not one of "
        "production, batch, best-effort"
    )


@pytest.mark.parametrize(
    "cls", ["system-cluster-critical", "system-node-critical", "e2e-high", "PILOTFISH-BATCH"]
)
def test_only_the_pilotfish_classes_are_accepted(cls: str) -> None:
    assert class_problem(pod(priorityClassName=cls), "shop") == (
        f"spec.priorityClassName {cls!r} is not allowed in namespace shop: pods of tenant "
        "namespaces run in a Pilotfish band, at pilotfish-production, pilotfish-batch, "
        "pilotfish-best-effort, which sets the team quota they are charged to (system and "
        "other classes are for system namespaces)"
    )


@pytest.mark.parametrize(
    "cls", [None, "", "pilotfish-production", "pilotfish-batch", "pilotfish-best-effort"]
)
def test_no_class_or_a_pilotfish_class_is_fine(cls: str | None) -> None:
    assert class_problem(pod(priorityClassName=cls), "shop") is None


def test_patch_sets_class_and_label_and_clears_the_computed_priority() -> None:
    p = pod(None, priority=0, preemptionPolicy="PreemptLowerPriority")
    ops = patch(p, BandChoice("production", "namespace default"))
    assert ops == [
        {"op": "add", "path": "/metadata/labels", "value": {"pilotfish.io/band": "production"}},
        {"op": "add", "path": "/spec/priorityClassName", "value": "pilotfish-production"},
        {"op": "remove", "path": "/spec/priority"},
        {"op": "remove", "path": "/spec/preemptionPolicy"},
    ]
    out = jsonpatch.apply_patch(p, ops)
    assert out["metadata"]["labels"] == {"pilotfish.io/band": "production"}
    assert "priority" not in out["spec"] and "preemptionPolicy" not in out["spec"]


def test_patch_keeps_other_labels() -> None:
    p = pod({"app": "web"})
    out = jsonpatch.apply_patch(p, patch(p, BandChoice("batch", "default")))
    assert out["metadata"]["labels"] == {"app": "web", "pilotfish.io/band": "batch"}
    assert out["spec"]["priorityClassName"] == "pilotfish-batch"


def test_patch_is_empty_when_already_right() -> None:
    p = pod({"pilotfish.io/band": "batch"}, priorityClassName="pilotfish-batch")
    assert patch(p, BandChoice("batch", "pod label")) == []
