"""`kubectl pilotfish why`: `explain` tells gated, unschedulable, not running and running apart.

Table-driven: each case is a pod (and its events) as the API returns them, and the sentences
the explanation must contain, plus sentences it must not (a gated pod is never called a
scheduling failure, a running pod is never called gated).
"""

from __future__ import annotations

import copy
import datetime
from dataclasses import dataclass, field
from typing import Any

import pytest

from pilotfish import gates, timeutil
from pilotfish.cli.why import explain, latest_event
from pilotfish.cli.whyquota import quota_sentence

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
SIGNAL = "gates.pilotfish.io/data-ready"
GANG = "gates.pilotfish.io/gang"


def at(seconds: float) -> str:
    return timeutil.format_time(NOW + datetime.timedelta(seconds=seconds))


def rec(
    condition: dict[str, Any] | None = None, timeout: int = 600, created: float = -60, **kw: Any
) -> gates.GateRecord:
    return gates.GateRecord(
        policy="nightly",
        generation=2,
        condition=condition or {"type": "GateSignal", "signalName": "data-ready"},
        timeout_seconds=timeout,
        deadline=at(created + timeout),
        **kw,
    )


BASE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u",
        "creationTimestamp": at(-60),
        "labels": {},
        "annotations": {},
    },
    "spec": {
        "schedulerName": "pilotfish-scheduler",
        "containers": [{"name": "app", "image": "example/app:1"}],
    },
    "status": {"phase": "Pending", "conditions": []},
}


def make(
    *,
    held: tuple[str, ...] = (),
    records: dict[str, gates.GateRecord] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    phase: str = "Pending",
    statuses: list[dict[str, Any]] | None = None,
    init_statuses: list[dict[str, Any]] | None = None,
    **status: Any,
) -> dict[str, Any]:
    pod = copy.deepcopy(BASE)
    if held:
        pod["spec"]["schedulingGates"] = [{"name": g} for g in held]
    if records is not None:
        pod["metadata"]["annotations"][gates.ANNOTATION_RECORD] = gates.PodGates(
            at(-60), records
        ).encode()
        pod["metadata"]["annotations"][gates.ANNOTATION_CREATED] = at(-60)
        pod["metadata"]["labels"][gates.LABEL_GATED] = "true"
    pod["metadata"]["labels"].update(labels or {})
    if node:
        pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = phase
    pod["status"]["conditions"] = conditions or []
    if statuses is not None:
        pod["status"]["containerStatuses"] = statuses
    if init_statuses is not None:
        pod["status"]["initContainerStatuses"] = init_statuses
    pod["status"].update(status)
    return pod


def cond(
    kind: str, status: str, reason: str = "", message: str = "", since: float = -30
) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at(since),
    }


def event(reason: str, message: str, seconds: float, count: int = 1) -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": at(seconds), "count": count}


@dataclass
class Case:
    id: str
    pod: dict[str, Any]
    says: list[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    never: list[str] = field(default_factory=list)
    first: str = ""  # the verdict sentence starts with this


CASES = [
    Case(
        "gated-signal",
        make(
            held=(SIGNAL,),
            records={SIGNAL: rec()},
            conditions=[
                cond(
                    gates.POD_CONDITION,
                    "False",
                    "SchedulingGated",
                    "GateSignal data-ready not Ready",
                    since=-50,
                )
            ],
        ),
        says=[
            f"waits on 1 Pilotfish gate(s) ({SIGNAL})",
            "this is not a scheduling failure",
            "signal 'data-ready' is raised (GateSignal(data-ready), from GatePolicy nightly "
            "generation 2)",
            "it has waited 60s",
            f"deadline {at(540)} (in 9m), then onExpiry Fail: the pod is failed",
            "reports SchedulingGated (50s ago): GateSignal data-ready not Ready",
        ],
        never=["unschedulable", "EXPIRED"],
        first="Pod ns/p is gated",
    ),
    Case(
        "gated-expired-review-and-foreign-gate",
        make(
            held=(GANG, "example.com/license"),
            records={GANG: rec({"type": "Gang", "size": 8}, timeout=30, on_expiry="Review")},
            labels={gates.LABEL_REVIEW: "required"},
            conditions=[cond(gates.POD_CONDITION, "False", "Expired", "gang of 3/8 after 30s")],
        ),
        says=[
            "8 pods of its gang can be released together (Gang(size=8)",
            f"its deadline {at(-30)} passed 30s ago (EXPIRED), onExpiry Review: the gate stays",
            "reports Expired",
            "gang of 3/8 after 30s",
            f"flagged for human review ({gates.LABEL_REVIEW}=required)",
            "also waits on 1 gate(s) Pilotfish does not own: example.com/license",
        ],
        first="Pod ns/p is gated",
    ),
    Case(
        "gated-without-record-or-state",
        make(held=(SIGNAL,)),
        says=[
            f"{SIGNAL} has no creation-time record",
            "no Pilotfish controller will release it",
            "has not reported on it yet",
            "check that the Pilotfish operator is running",
        ],
        first="Pod ns/p is gated",
    ),
    Case(
        "gated-retry-quota-image",
        make(
            held=(SIGNAL, GANG),
            records={
                SIGNAL: rec({"type": "Quota"}, on_expiry="Retry", attempts=2),
                GANG: rec({"type": "Image", "minNodes": 3}),
            },
        ),
        says=[
            "waits on 2 Pilotfish gate(s)",
            "the team's quota admits the pod",
            "onExpiry Retry: the condition is retried with backoff",
            "retried 2 time(s) so far",
            "its images are present on 3 node(s) (Image(minNodes=3)",
        ],
    ),
    Case(
        "other-owners-gates-only",
        make(held=("example.com/license",)),
        says=[
            "gated by scheduling gate(s) Pilotfish does not own: example.com/license",
            "until their owners remove them",
        ],
        never=["Pilotfish gate(s) (", "gate controller"],
        first="Pod ns/p is gated by scheduling gate(s) Pilotfish does not own",
    ),
    Case(
        "unschedulable-with-event",
        make(
            conditions=[
                cond(
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                    "0/12 nodes are available: 12 Insufficient cpu.",
                    since=-120,
                )
            ]
        ),
        events=[
            event("FailedScheduling", "older message", -110),
            event("FailedScheduling", "0/12 nodes are available: 12 Insufficient cpu.", -5, 7),
            event("Scheduled", "not this one", -1),
        ],
        says=[
            "pilotfish-scheduler tried and found no node for it (Unschedulable, 2m ago): "
            "0/12 nodes are available: 12 Insufficient cpu.",
            "Latest FailedScheduling event: 0/12 nodes are available: 12 Insufficient cpu. "
            "(5s ago, 7 times)",
        ],
        never=["older message", "gated"],
        first="Pod ns/p is unschedulable",
    ),
    Case(
        "unschedulable-event-only-nominated",
        make(nominatedNodeName="kwok-zone-a-0"),
        events=[event("FailedScheduling", "no node in zone-b has 8 free GPUs", -3)],
        says=[
            "Latest FailedScheduling event: no node in zone-b has 8 free GPUs (3s ago)",
            "nominated for node kwok-zone-a-0",
        ],
        first="Pod ns/p is unschedulable",
    ),
    Case(
        "not-tried-yet",
        make(),
        says=["waits for pilotfish-scheduler to place it", "has not been tried yet"],
        never=["unschedulable", "gated:"],
        first="Pod ns/p waits for pilotfish-scheduler",
    ),
    Case(
        "released-after-expiry-retry-unschedulable",
        make(
            conditions=[
                cond("PodScheduled", "False", "Unschedulable", "0/3 nodes: Insufficient memory"),
                cond(gates.POD_CONDITION, "False", "Expired", "gate expired; retrying"),
            ]
        ),
        says=["Insufficient memory", "Its Pilotfish gates expired: gate expired; retrying"],
        first="Pod ns/p is unschedulable",
    ),
    Case(
        "image-pull",
        make(
            node="kwok-zone-a-1",
            statuses=[
                {
                    "name": "app",
                    "image": "example/app:1",
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "waiting": {
                            "reason": "ImagePullBackOff",
                            "message": 'Back-off pulling image "example/app:1"',
                        }
                    },
                }
            ],
            conditions=[
                cond("PodScheduled", "True"),
                cond(
                    "Ready", "False", "ContainersNotReady", "containers with unready status: [app]"
                ),
            ],
        ),
        says=[
            "bound to node kwok-zone-a-1 but not running yet (phase Pending)",
            "Container app cannot pull its image example/app:1 (ImagePullBackOff): Back-off "
            'pulling image "example/app:1"',
            "Ready is False: ContainersNotReady: containers with unready status: [app]",
        ],
        never=["gated", "unschedulable"],
        first="Pod ns/p is bound to node kwok-zone-a-1",
    ),
    Case(
        "crash-loop",
        make(
            node="n1",
            phase="Running",
            statuses=[
                {
                    "name": "app",
                    "ready": False,
                    "restartCount": 5,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m"}},
                    "lastState": {"terminated": {"reason": "Error", "exitCode": 137}},
                }
            ],
            conditions=[cond("Ready", "False", "ContainersNotReady")],
        ),
        says=[
            "is running on node n1 but is not ready",
            "Container app is crash-looping (restarted 5 times); last exit: Error with code 137: "
            "back-off 2m",
            "Ready is False: ContainersNotReady.",
        ],
        first="Pod ns/p is running on node n1 but is not ready",
    ),
    Case(
        "running-not-ready-probe-and-init",
        make(
            node="n1",
            phase="Running",
            init_statuses=[
                {"name": "setup", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}}
            ],
            statuses=[{"name": "app", "ready": False, "state": {"running": {}}}],
            conditions=[cond("Ready", "False", "ContainersNotReady")],
        ),
        says=["Container app is running but not ready (its readiness probe has not passed yet)"],
        never=["setup"],
        first="Pod ns/p is running on node n1 but is not ready",
    ),
    Case(
        "bound-creating",
        make(
            node="n2",
            statuses=[{"name": "app", "state": {"waiting": {"reason": "ContainerCreating"}}}],
        ),
        says=["Container app is being created (ContainerCreating)"],
        first="Pod ns/p is bound to node n2 but not running yet",
    ),
    Case(
        "running-and-ready",
        make(
            node="kwok-zone-b-2",
            phase="Running",
            statuses=[{"name": "app", "ready": True, "state": {"running": {}}}],
            conditions=[cond("Ready", "True", since=-90)],
        ),
        says=["Pod ns/p is running on node kwok-zone-b-2 and ready (90s ago)."],
        never=["gated", "unschedulable", "not ready"],
        first="Pod ns/p is running on node kwok-zone-b-2 and ready",
    ),
    Case(
        "failed",
        make(
            node="n1",
            phase="Failed",
            reason="DeadlineExceeded",
            statuses=[{"name": "app", "state": {"terminated": {"reason": "Error", "exitCode": 2}}}],
        ),
        says=[
            "has finished: it Failed: DeadlineExceeded",
            "Container app terminated: Error with exit code 2",
        ],
        first="Pod ns/p has finished",
    ),
    Case(
        "succeeded",
        make(node="n1", phase="Succeeded"),
        says=["Pod ns/p has finished: it Succeeded."],
        never=["terminated"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_explain(case: Case) -> None:
    lines = explain(case.pod, case.events, NOW)
    text = "\n".join(lines)
    for expected in case.says:
        assert expected in text, f"missing {expected!r} in:\n{text}"
    for unexpected in case.never:
        assert unexpected not in text, f"unexpected {unexpected!r} in:\n{text}"
    if case.first:
        assert lines[0].startswith(case.first), text
    assert all(line.strip() for line in lines)


def test_deleting_pod_says_so_before_anything_else() -> None:
    pod = make(held=(SIGNAL,), records={SIGNAL: rec()})
    pod["metadata"]["deletionTimestamp"] = at(-4)
    lines = explain(pod, [], NOW)
    assert lines[0] == "Pod ns/p is being deleted (requested 4s ago)."
    assert lines[1].startswith("Pod ns/p is gated")


def test_latest_event_reads_both_event_apis() -> None:
    core = event("FailedScheduling", "core", -30)
    new = {
        "reason": "FailedScheduling",
        "note": "events.k8s.io",
        "eventTime": at(-60),
        "series": {"count": 3, "lastObservedTime": at(-2)},
    }
    assert latest_event([core, new], "FailedScheduling") is new
    assert latest_event([core], "Scheduled") is None
    lines = explain(make(), [core, new], NOW)
    assert "events.k8s.io (2s ago, 3 times)" in "\n".join(lines)


def test_explain_does_not_modify_its_inputs() -> None:
    pod = make(held=(SIGNAL,), records={SIGNAL: rec()})
    events = [event("FailedScheduling", "x", -1)]
    before = (copy.deepcopy(pod), copy.deepcopy(events))
    explain(pod, events, NOW)
    assert (pod, events) == before


def _quota_pod(cpu: str, gated: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": "gates.pilotfish.io/quota-available"}]
    return {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"pilotfish.io/band": "batch"}},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def _tq(used: str, limit: str = "100") -> dict[str, Any]:
    return {
        "metadata": {"name": "payments"},
        "spec": {"team": "payments", "bands": {"batch": {"cpu": limit}}},
        "status": {"used": {"batch": {"cpu": used}}},
    }


@pytest.mark.parametrize(
    ("pod", "tq", "want"),
    [
        (
            _quota_pod("8", gated=True),
            _tq("96"),
            "Quota (TeamQuota payments): team payments, batch cpu: 96 of 100 used, pod asks 8",
        ),
        (
            _quota_pod("2", gated=True),
            _tq("96"),
            "Quota (TeamQuota payments): within the batch band's limits (cpu 96 of 100 used).",
        ),
        (
            # Admitted: 96 counted includes the pod's own 8.
            _quota_pod("8", gated=False),
            _tq("96"),
            "Quota (TeamQuota payments): batch cpu: this pod holds 8; others use 88 of 100.",
        ),
        (
            # Quota lowered below what runs: said, never a negative room.
            _quota_pod("8", gated=False),
            _tq("100", limit="90"),
            "Quota (TeamQuota payments): batch cpu: this pod holds 8; others use 92 of 90 "
            "(10 over the limit together).",
        ),
        (
            # Admitted but not counted yet (the operator lags): others are never below zero.
            _quota_pod("1500m", gated=False),
            _tq("1"),
            "Quota (TeamQuota payments): batch cpu: this pod holds 1500m; others use 0 of 100.",
        ),
        (
            _quota_pod("8", gated=True),
            None,
            "Quota: team payments has no TeamQuota granting the batch band.",
        ),
    ],
)
def test_quota_sentence_gives_the_amounts(
    pod: dict[str, Any], tq: dict[str, Any] | None, want: str
) -> None:
    assert quota_sentence(pod, "payments", tq) == want
    assert quota_sentence(pod, None, tq) is None


def test_an_admitted_pod_is_told_what_it_holds_and_what_others_use_per_resource() -> None:
    """The issue's case: a 2-CPU production quota, this pod holding 1 of the 2 used."""
    pod = _quota_pod("1", gated=False)
    pod["metadata"]["labels"]["pilotfish.io/band"] = "production"
    pod["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1Gi"
    tq = {
        "metadata": {"name": "payments"},
        "spec": {
            "team": "payments",
            "bands": {"production": {"cpu": "2", "memory": "166429982720", "pods": 10}},
        },
        "status": {
            "used": {"production": {"cpu": "1500m", "memory": "2Gi", "pods": 2}},
            "reserved": {"production": {"cpu": "500m", "pods": 1}},
            "reservations": [
                {
                    "pod": "shop/other",
                    "uid": "other",
                    "band": "production",
                    "resources": {"cpu": "500m", "pods": 1},
                    "time": "2026-01-01T00:00:00Z",
                }
            ],
        },
    }
    assert quota_sentence(pod, "payments", tq) == (
        "Quota (TeamQuota payments): production cpu: this pod holds 1; others use 1 of 2. "
        "production memory: this pod holds 1Gi; others use 1Gi of 155Gi. "
        "production pods: this pod holds 1; others use 2 of 10."
    )


def test_an_admitted_pod_in_a_band_without_limits_is_told_what_it_holds() -> None:
    tq = _tq("5")
    tq["spec"]["bands"]["batch"] = {}
    assert quota_sentence(_quota_pod("250m", gated=False), "payments", tq) == (
        "Quota (TeamQuota payments): the batch band limits nothing; this pod holds cpu 250m, "
        "pods 1."
    )
