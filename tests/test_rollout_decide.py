"""`decide`, pure: the phases (sync, rolling, progress, status) as one plan from one snapshot."""

from __future__ import annotations

import datetime
from typing import Any

from pilotfish.api.serviceworkload import ServiceWorkload
from pilotfish.operators.serviceworkload import rolling
from pilotfish.operators.serviceworkload.decide import CreatePods, DeletePod, DrainPod, decide
from pilotfish.operators.serviceworkload.model import Observed
from pilotfish.operators.serviceworkload.revisions import (
    owned_revisions,
    revision_body,
    template_hash,
)
from pilotfish.operators.serviceworkload.status import replica_failure
from pilotfish.timeutil import format_micro_time, format_time
from pilotfish.workloads import ANNOTATION_DRAIN, ANNOTATION_DRAINED, LABEL_REVISION

Obj = dict[str, Any]
AT = datetime.datetime(2026, 1, 1, 12, tzinfo=datetime.UTC)
TEMPLATE: Obj = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}
HASH = template_hash(TEMPLATE)


def sw(replicas: int = 3, **spec: Any) -> Obj:
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "ServiceWorkload",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"team": "t", "replicas": replicas, "template": TEMPLATE, **spec},
    }


def recorded(workload: Obj) -> Obj:
    body = revision_body(workload, HASH, 1, TEMPLATE, format_micro_time(AT))
    body["metadata"] |= {"resourceVersion": "5", "creationTimestamp": format_time(AT)}
    return body


def ready_pod(name: str, *, annotations: dict[str, str] | None = None) -> Obj:
    since = format_time(AT - datetime.timedelta(minutes=5))
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": f"rv-{name}",
            "creationTimestamp": since,
            "labels": {LABEL_REVISION: HASH},
            "annotations": annotations or {},
            "ownerReferences": [{"controller": True, "kind": "ServiceWorkload", "uid": "u"}],
        },
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}],
        },
    }


def observed(workload: Obj, pods: list[Obj], *, revisions: bool = True, **kw: Any) -> Observed:
    workload["metadata"].setdefault("resourceVersion", "7")
    return Observed(
        key="ns/web",
        sw=workload,
        model=ServiceWorkload.model_validate(workload),
        pods=tuple(pods),
        revisions=tuple(owned_revisions([recorded(workload)], "u")) if revisions else (),
        pdb=None,
        at=AT,
        **kw,
    )


def test_a_round_that_records_a_revision_does_nothing_else() -> None:
    plan = decide(observed(sw(), [], revisions=False))
    assert plan.revision is not None and plan.revision.name == f"web-{HASH}"
    assert plan.pdb is not None and plan.pdb.create is not None, "the budget goes with it"
    assert (plan.creates, plan.takedowns, plan.status) == ((), (), None)


def test_status_is_computed_from_the_pods_observed_not_from_the_plan() -> None:
    plan = decide(observed(sw(), []))
    assert plan.creates == (CreatePods(HASH, 3, TEMPLATE),)
    assert plan.status is not None
    assert plan.status.status["replicas"] == 0, "the 3 creates are not counted yet"
    assert plan.status.resource_version == "7", "conditional on the workload decided from"


def test_takedowns_are_conditional_on_the_pod_decided_from() -> None:
    drained = format_micro_time(AT - datetime.timedelta(seconds=10))
    pods = [
        ready_pod("a"),
        ready_pod("b"),
        ready_pod("c", annotations={ANNOTATION_DRAIN: drained, ANNOTATION_DRAINED: drained}),
    ]
    plan = decide(observed(sw(replicas=1, service={"ports": [{"name": "http", "port": 80}]}), pods))
    deletes = [w for w in plan.takedowns if isinstance(w, DeletePod)]
    drains = [w for w in plan.takedowns if isinstance(w, DrainPod)]
    assert deletes == [DeletePod("c", "uid-c", rolling.DELETE_DRAINED)]
    assert len(drains) == 1
    test_op = drains[0].patch[0]
    assert test_op == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": f"rv-{drains[0].name}",
    }


def test_a_refusal_of_another_generation_is_not_status() -> None:
    old = replica_failure(0, "quota exceeded")
    plan = decide(observed(sw(), [], failure=old))
    assert plan.status is not None
    types = {c["type"] for c in plan.status.status["conditions"]}
    assert "ReplicaFailure" not in types
    now = replica_failure(1, "quota exceeded")
    plan = decide(observed(sw(), [], failure=now))
    assert plan.status is not None
    assert "ReplicaFailure" in {c["type"] for c in plan.status.status["conditions"]}
