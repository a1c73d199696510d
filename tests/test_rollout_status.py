"""Status, conditions and the progress deadline; pods as the planner sees them; the PDB."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

import pytest

from pilotfish import names
from pilotfish.api.serviceworkload import AVAILABLE, PROGRESSING, STALLED
from pilotfish.conditions import CONDITION_MESSAGE_MAX
from pilotfish.kube import projections
from pilotfish.operators.serviceworkload.decide import drain_patch
from pilotfish.operators.serviceworkload.model import parse_time, pod_state
from pilotfish.operators.serviceworkload.pdb import desired_spec, pdb_body, pdb_patch
from pilotfish.operators.serviceworkload.progress import (
    REASON_COMPLETE,
    REASON_DEADLINE_EXCEEDED,
    REASON_IN_PROGRESS,
    REASON_PAUSED,
    Progress,
    State,
    assess,
    is_complete,
    last_progress_at,
)
from pilotfish.operators.serviceworkload.rolling import (
    Budget,
    Desired,
    PodState,
    resolve_budget,
)
from pilotfish.operators.serviceworkload.status import (
    PODS_UNSCHEDULABLE,
    REASON_MIN_AVAILABLE,
    REASON_MIN_UNAVAILABLE,
    compute_status,
    stable_revision,
)
from pilotfish.podtemplate import pod_body
from pilotfish.timeutil import format_micro_time
from pilotfish.workloads import ANNOTATION_DRAIN, ANNOTATION_DRAINED, LABEL_REVISION, LABEL_WORKLOAD

NOW = 1_700_000_000.0


def pod(name: str, revision: str, ready: float | None = NOW - 60, **kw: Any) -> PodState:
    return PodState(
        name,
        revision,
        created_at=NOW - 100,
        scheduled=True,
        running=True,
        ready_since=ready,
        has_address=True,
        **kw,
    )


def want(replicas: int = 3, paused: bool = False, min_ready: float = 0) -> Desired:
    return Desired(resolve_budget(replicas, 1, 0, min_ready), "new", "old", paused)


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def status_for(
    pods: list[PodState], *, state: State = "progressing", previous: dict[str, Any] | None = None
) -> dict[str, Any]:
    return compute_status(
        name="web",
        generation=7,
        pods=pods,
        desired=want(),
        progress=Progress(state, NOW),
        current_revision="old",
        previous=previous,
        deadline_seconds=600,
        now=NOW,
        now_str="2023-11-14T22:13:20Z",
    )


# -- progress --------------------------------------------------------------------------------


def test_complete_needs_every_replica_updated_available_and_nothing_else_left() -> None:
    done = [pod(f"n{i}", "new") for i in range(3)]
    assert is_complete(done, want(), NOW)
    assert not is_complete([*done[:2], pod("o", "old")], want(), NOW)
    assert not is_complete([*done[:2], pod("n2", "new", ready=None)], want(), NOW)
    draining = dataclasses.replace(pod("o", "old"), drain_requested_at=NOW)
    assert not is_complete([*done, draining], want(), NOW), "old pod still leaving"
    gone = dataclasses.replace(pod("o", "old"), terminating=True)
    assert is_complete([*done, gone], want(), NOW)
    assert not is_complete(done, want(min_ready=120), NOW), "not Ready long enough"


def test_last_progress_is_the_latest_move_of_the_update_revision() -> None:
    pods = [
        pod("o", "old", ready=NOW - 5),  # old pods becoming ready are not rollout progress
        pod("n", "new", ready=NOW - 30),
        dataclasses.replace(pod("d", "old"), drain_requested_at=NOW - 20),
    ]
    at = last_progress_at(pods, want(), NOW, activated_at=NOW - 300, progressing_since=None)
    assert at == NOW - 20
    resumed = last_progress_at(pods, want(), NOW, activated_at=NOW - 300, progressing_since=NOW - 1)
    assert resumed == NOW - 1


def test_deadline_is_a_wake_up_then_a_stall() -> None:
    moving = assess(complete=False, paused=False, last_progress=NOW, deadline_seconds=60, now=NOW)
    assert moving.state == "progressing" and moving.deadline_at == NOW + 60
    stalled = assess(
        complete=False, paused=False, last_progress=NOW, deadline_seconds=60, now=NOW + 60
    )
    assert stalled.state == "stalled" and stalled.deadline_at is None
    paused = assess(
        complete=False, paused=True, last_progress=NOW, deadline_seconds=60, now=NOW + 600
    )
    assert paused.state == "paused", "no deadline while paused"
    done = assess(complete=True, paused=False, last_progress=0, deadline_seconds=1, now=NOW)
    assert done.state == "complete"


# -- status ----------------------------------------------------------------------------------


def test_counts_leave_draining_pods_out_of_ready_available_and_updated() -> None:
    pods = [
        pod("n1", "new"),
        pod("n2", "new", ready=None),
        pod("o1", "old"),
        dataclasses.replace(pod("o2", "old"), drain_requested_at=NOW),
        dataclasses.replace(pod("o3", "old"), terminating=True),
        dataclasses.replace(pod("f", "new"), terminated=True),
    ]
    s = status_for(pods)
    assert s["replicas"] == 4  # n1 n2 o1 and the draining o2
    assert s["readyReplicas"] == 2
    assert s["availableReplicas"] == 2
    assert s["updatedReplicas"] == 2
    assert s["observedGeneration"] == 7
    assert s["selector"] == f"{LABEL_WORKLOAD}=web"
    assert (s["currentRevision"], s["updateRevision"]) == ("old", "new")


@pytest.mark.parametrize(
    ("state", "progressing", "stalled"),
    [
        ("progressing", ("True", REASON_IN_PROGRESS), ("False", REASON_IN_PROGRESS)),
        ("complete", ("True", REASON_COMPLETE), ("False", REASON_COMPLETE)),
        ("paused", ("Unknown", REASON_PAUSED), ("False", REASON_PAUSED)),
        ("stalled", ("False", REASON_DEADLINE_EXCEEDED), ("True", REASON_DEADLINE_EXCEEDED)),
    ],
)
def test_conditions_per_rollout_state(
    state: State, progressing: tuple[str, str], stalled: tuple[str, str]
) -> None:
    s = status_for([pod(f"o{i}", "old") for i in range(3)], state=state)
    got = conditions(s)
    assert got[AVAILABLE] == ("True", REASON_MIN_AVAILABLE)
    assert got[PROGRESSING] == progressing
    assert got[STALLED] == stalled
    assert all(c["observedGeneration"] == 7 for c in s["conditions"])


def test_available_is_false_below_the_floor() -> None:
    s = status_for([pod("o1", "old"), pod("o2", "old", ready=None)])
    assert conditions(s)[AVAILABLE] == ("False", REASON_MIN_UNAVAILABLE)


def test_transition_time_only_moves_when_the_status_does() -> None:
    first = status_for([pod(f"o{i}", "old") for i in range(3)])
    later = dict(first)
    later_status = compute_status(
        name="web",
        generation=8,
        pods=[pod(f"o{i}", "old") for i in range(3)],
        desired=want(),
        progress=assess(
            complete=False, paused=False, last_progress=NOW, deadline_seconds=9, now=NOW
        ),
        current_revision="old",
        previous=later,
        deadline_seconds=9,
        now=NOW + 50,
        now_str="later",
    )
    times = {c["type"]: c["lastTransitionTime"] for c in later_status["conditions"]}
    assert set(times.values()) == {"2023-11-14T22:13:20Z"}
    flipped = status_for([pod("o1", "old")], previous=later_status)
    assert conditions(flipped)[AVAILABLE][0] == "False"


def test_conditions_of_other_writers_are_kept() -> None:
    foreign = {"type": "example.com/Audited", "status": "True", "reason": "Yes"}
    s = status_for([], previous={"conditions": [foreign]})
    assert foreign in s["conditions"]


def test_stable_revision_is_the_last_complete_one() -> None:
    pods = [pod("a", "x"), pod("b", "y"), pod("c", "y")]
    assert stable_revision(pods, None, "z", complete=True) == "z"
    assert stable_revision(pods, "x", "z", complete=False) == "x"
    assert stable_revision(pods, None, "z", complete=False) == "y", "most pods run it"
    assert stable_revision([], None, "z", complete=False) == "z"


# -- pods ------------------------------------------------------------------------------------


def raw_pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web-abc-xyz12",
            "namespace": "ns",
            "resourceVersion": "9",
            "creationTimestamp": "2023-11-14T22:13:20Z",
            "labels": {LABEL_REVISION: "abc"},
            "annotations": {"keep": "me"},
            "managedFields": [{"big": "x" * 100}],
        },
        "spec": {"nodeName": "kwok-1", "containers": [{"name": "c", "image": "i"}]},
        "status": status,
    }


def test_pod_state_reads_readiness_phase_and_drain_annotations() -> None:
    ready = raw_pod(
        phase="Running",
        podIP="10.0.0.1",
        conditions=[
            {"type": "Ready", "status": "True", "lastTransitionTime": "2023-11-14T22:13:30Z"}
        ],
    )
    ready["metadata"]["annotations"][ANNOTATION_DRAIN] = "2023-11-14T22:14:00.500000Z"
    ready["metadata"]["annotations"][ANNOTATION_DRAINED] = "2023-11-14T22:14:01Z"
    s = pod_state(ready, NOW)
    assert s.revision == "abc" and s.scheduled and s.running and s.has_address
    assert s.ready_since == NOW + 10
    assert s.drain_requested_at == NOW + 40.5
    assert s.drained_at == NOW + 41
    failed = pod_state(raw_pod(phase="Failed", reason="Evicted"), NOW)
    assert failed.terminated and not failed.counted
    unready = raw_pod(phase="Running", conditions=[{"type": "Ready", "status": "False"}])
    assert pod_state(unready, NOW).ready_since is None


def test_an_unreadable_drain_time_counts_as_long_ago() -> None:
    p = raw_pod(phase="Running")
    p["metadata"]["annotations"][ANNOTATION_DRAIN] = "yesterday"
    assert pod_state(p, NOW).drain_requested_at == 0.0


def test_times_round_trip() -> None:
    at = datetime.datetime.fromtimestamp(NOW + 0.25, datetime.UTC)
    assert parse_time(format_micro_time(at)) == NOW + 0.25
    assert parse_time("2023-11-14T22:13:20Z") == NOW
    assert parse_time("nonsense") is None and parse_time(None) is None


def test_pod_body_labels_owner_and_template() -> None:
    sw = {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "ServiceWorkload",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u"},
        "spec": {"team": "payments", "band": "batch"},
    }
    tpl = {
        "metadata": {"labels": {"app": "web", LABEL_WORKLOAD: "forged"}, "annotations": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    body = pod_body(sw, tpl, "abc", "web-abc-xyz12")
    labels = body["metadata"]["labels"]
    assert labels == {
        "app": "web",
        LABEL_WORKLOAD: "web",
        LABEL_REVISION: "abc",
        names.LABEL_TEAM: "payments",
        names.LABEL_BAND: "batch",
    }
    assert body["metadata"]["annotations"] == {"a": "b"}
    ref = body["metadata"]["ownerReferences"][0]
    assert (ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == ("u", True, True)
    assert body["spec"] == tpl["spec"]


def test_drain_patch_is_conditional_and_keeps_other_annotations() -> None:
    ops = drain_patch(raw_pod(), "T")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "9"}
    assert ops[1]["value"] == {"keep": "me", ANNOTATION_DRAIN: "T"}


def test_the_process_pod_projection_keeps_everything_the_controller_reads() -> None:
    """The controller reads pods only through the shared projection: a field it drops
    would silently read as absent (a ready pod as not ready, a drain as never asked)."""
    full = raw_pod(
        phase="Running",
        podIP="10.0.0.1",
        containerStatuses=[{"name": "c", "ready": True, "image": "i", "state": {}}],
        conditions=[
            {"type": "Ready", "status": "True", "lastTransitionTime": "2023-11-14T22:13:30Z"},
            {"type": "PodScheduled", "status": "True"},
        ],
    )
    meta = full["metadata"]
    meta["annotations"] |= {ANNOTATION_DRAIN: "2023-11-14T22:14:00Z"}
    meta["annotations"] |= {ANNOTATION_DRAINED: "2023-11-14T22:14:01Z"}
    meta["deletionTimestamp"] = "2023-11-14T22:15:00Z"
    meta["ownerReferences"] = [{"kind": "ServiceWorkload", "name": "web", "uid": "u"}]
    kept = projections.pod(copy.deepcopy(full))
    assert pod_state(kept, NOW) == pod_state(full, NOW)
    assert kept["metadata"]["ownerReferences"] == meta["ownerReferences"]
    assert "managedFields" not in kept["metadata"]


# -- the disruption budget -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "max_unavailable"),
    [(Budget(3, 1, 0), 1), (Budget(10, 1, 3), 3), (resolve_budget(10, 2, "25%"), 2)],
)
def test_pdb_follows_the_strategy_but_never_blocks_every_eviction(
    budget: Budget, max_unavailable: int
) -> None:
    spec = desired_spec("web", budget)
    assert spec["maxUnavailable"] == max_unavailable
    assert spec["selector"] == {"matchLabels": {LABEL_WORKLOAD: "web"}}


def test_pdb_is_patched_only_when_it_differs() -> None:
    sw = {
        "apiVersion": "a",
        "kind": "k",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u"},
    }
    body = pdb_body(sw, Budget(3, 1, 0))
    body["metadata"]["resourceVersion"] = "5"
    assert pdb_patch(body, desired_spec("web", Budget(3, 1, 0))) is None
    ops = pdb_patch(body, desired_spec("web", Budget(3, 1, 2)))
    assert ops is not None and ops[0]["value"] == "5"
    assert ops[1]["value"]["maxUnavailable"] == 2


# -- pods the scheduler cannot place --------------------------------------------------------

NO_ZONE = "0/12 nodes are available: 12 node(s) didn't match Pod's node affinity/selector."


def test_pods_the_scheduler_cannot_place_are_a_condition_with_its_reason() -> None:
    pods = [
        pod("a", "new"),
        PodState("b", "new", created_at=NOW - 100, unschedulable=NO_ZONE),
    ]
    status = status_for(pods)
    [cond] = [c for c in status["conditions"] if c["type"] == PODS_UNSCHEDULABLE]
    assert (cond["status"], cond["reason"]) == ("True", "Unschedulable")
    assert cond["message"] == f"1 of 2 pods cannot be placed; b: {NO_ZONE}"
    # Once placed, the condition is gone (as ReplicaFailure goes), not left False.
    placed = status_for([pod("a", "new"), pod("b", "new")], previous=status)
    assert PODS_UNSCHEDULABLE not in conditions(placed)


def test_pod_state_reads_the_schedulers_reason_but_not_a_gated_pods() -> None:
    def with_scheduled(reason: str, message: str = NO_ZONE) -> dict[str, Any]:
        cond = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        raw = raw_pod(phase="Pending", conditions=[cond])
        raw["spec"].pop("nodeName")
        return raw

    assert pod_state(with_scheduled("Unschedulable"), NOW).unschedulable == NO_ZONE
    assert pod_state(with_scheduled("SchedulingGated"), NOW).unschedulable is None
    assert pod_state(raw_pod(phase="Running"), NOW).unschedulable is None


def test_a_long_scheduler_reason_is_cut_to_the_condition_bound() -> None:
    long = PodState("b", "new", created_at=NOW - 100, unschedulable="x" * 100_000)
    status = status_for([pod("a", "new"), long])
    [cond] = [c for c in status["conditions"] if c["type"] == PODS_UNSCHEDULABLE]
    assert len(cond["message"]) == CONDITION_MESSAGE_MAX
    assert cond["message"].endswith(" ...")
