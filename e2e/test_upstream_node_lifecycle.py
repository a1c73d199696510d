"""Machine failure where upstream's node lifecycle and taint eviction controllers run, as on a
managed cluster that cannot turn them off (`pilotfish dev up --node-lifecycle upstream`).

Upstream marks the silent node (Ready Unknown after its 50 s grace period, the unreachable
taints) and evicts by tolerations; Pilotfish's webhook gave the ordinary pod 60 s instead of
upstream's 300 s, so it is evicted 60 s after the taint and replaced; the at-most-one pod
tolerates the node's loss forever, so upstream never evicts it, and Pilotfish releases it
once its lease has surely expired. The node then returns untainted and empty.

This module switches the session's local cluster to upstream mode while it runs
(`cluster.switch_node_lifecycle`: kube-controller-manager and the operator restart, about
2 s) and back at its end; the silenced node is one of the two in zone `e2e-upstream-a`,
which only this module uses. One fixture silences
it once, samples the cluster every 0.5 s (`benchmarks.probes.nodefailure`) until both pods
are replaced, restores it and records its return; the tests read the recording.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pytest
from kubernetes import client as k8s

from benchmarks.probes import nodefailure as nf
from e2e.conftest import Env, team_namespace, tenant_of, wait_until
from e2e.lostnodes import fault_zone, lease_renew_time, restore, silence
from e2e.test_serviceworkload import service_workload
from pilotfish import names
from pilotfish.devcluster import cluster
from pilotfish.nodesilence import MODE_PILOTFISH, MODE_UPSTREAM
from pilotfish.timeutil import parse_time
from pilotfish.webhooks.tolerations import LOST_NODE_TAINTS, UNREACHABLE

pytestmark = [pytest.mark.e2e, pytest.mark.lostnodes]

ZONE: Final = "e2e-upstream-a"
TEAM: Final = "e2e"
ORDINARY: Final = "web"
AT_MOST_ONE: Final = "solo"
EVICTION_WAIT: Final = 60  # PILOTFISH_EVICTION_WAIT_SECONDS' default
RELEASE_AFTER: Final = 40 + 15  # at_most_one_release_after's defaults
UPSTREAM_MESSAGE: Final = "Kubelet stopped posting node status."
SAMPLE_EVERY: Final = 0.5
SCENARIO_TIMEOUT: Final = 240.0


@pytest.fixture(scope="module")
def upstream_env(env: Env) -> Iterator[Env]:
    """The session's local cluster in upstream mode for this module (kube-controller-manager
    with upstream's node lifecycle and taint eviction controllers, the operator told so),
    switched back afterwards: a cluster of its own would cost a start-up and, beside the
    suite, more CPU than the machine has."""
    layout = env.require_local()
    assert env.spec is not None
    cluster.switch_node_lifecycle(layout, env.spec.ports, MODE_UPSTREAM)
    try:
        yield env
    finally:
        cluster.switch_node_lifecycle(layout, env.spec.ports, MODE_PILOTFISH)


def _items(resp: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
    return items


@dataclass(frozen=True)
class Snap:
    """One sample, and what `nf.Sample` does not keep: each pod's epoch and lost-node
    tolerations, each node's Ready message and when its unreachable NoExecute taint came."""

    s: nf.Sample
    epochs: dict[str, str]
    tolerations: dict[str, dict[str, int | None]]
    ready_message: dict[str, str]
    tainted_at: dict[str, float]


def _lost_node_tolerations(pod: dict[str, Any]) -> dict[str, int | None]:
    return {
        t["key"]: t.get("tolerationSeconds")
        for t in pod["spec"].get("tolerations") or []
        if t.get("key") in LOST_NODE_TAINTS and t.get("effect") == "NoExecute"
    }


def _snap(env: Env, namespace: str) -> Snap:
    core, coord = k8s.CoreV1Api(env.api), k8s.CoordinationV1Api(env.api)
    raw: dict[str, Any] = {"_preload_content": False, "_request_timeout": 10}
    at = time.time()
    nodes = _items(core.list_node(label_selector=f"{names.LABEL_ZONE}={ZONE}", **raw))
    leases = _items(coord.list_namespaced_lease("kube-node-lease", **raw))
    pods = {
        f"{namespace}/{p['metadata']['name']}": p
        for p in _items(core.list_namespaced_pod(namespace, **raw))
    }
    messages: dict[str, str] = {}
    tainted: dict[str, float] = {}
    for n in nodes:
        name = n["metadata"]["name"]
        ready = [c for c in n["status"].get("conditions") or [] if c["type"] == "Ready"]
        messages[name] = str(ready[0].get("message") or "") if ready else ""
        for t in n["spec"].get("taints") or []:
            if t["key"] == UNREACHABLE and t["effect"] == "NoExecute" and t.get("timeAdded"):
                tainted[name] = parse_time(t["timeAdded"]).timestamp()
    return Snap(
        nf.sample(at, time.time(), nodes, leases, list(pods.values()), []),
        {
            k: (p["metadata"].get("annotations") or {}).get(names.ANNOTATION_EPOCH, "")
            for k, p in pods.items()
        },
        {k: _lost_node_tolerations(p) for k, p in pods.items()},
        messages,
        tainted,
    )


class Recorder(threading.Thread):
    def __init__(self, env: Env, namespace: str) -> None:
        super().__init__(name="upstream-lifecycle-recorder", daemon=True)
        self.env, self.namespace = env, namespace
        self.snaps: list[Snap] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            started = time.monotonic()
            try:
                self.snaps.append(_snap(self.env, self.namespace))
            except Exception as e:  # a missed sample is a gap, not the end of the record
                self.errors.append(f"{type(e).__name__}: {e}")
            self.done.wait(max(0.0, SAMPLE_EVERY - (time.monotonic() - started)))

    def latest(self) -> Snap | None:
        return self.snaps[-1] if self.snaps else None


def workload(name: str, at_most_one: bool) -> dict[str, Any]:
    return service_workload(
        name,
        TEAM,
        1,
        atMostOne=at_most_one,
        placement={"zones": [ZONE]},
        service={"ports": [{"name": "http", "port": 80}]},
    )


@dataclass
class Recording:
    namespace: str
    lost: str  # the node silenced
    spare: str  # the zone's other node, where replacements go
    ordinary: str  # "ns/name" of the ordinary pod on `lost`
    held: str  # "ns/name" of the at-most-one pod on `lost`
    renewed: float  # the lost node's last lease renewal before silence
    silenced_at: float  # when the node was silenced (its pods may be younger than `renewed`)
    restored_at: float
    snaps: list[Snap]
    events: list[dict[str, Any]]
    notes: list[str]

    def when(self, holds: Any, since: float | None = None) -> nf.When | None:
        """The first sample after `since` (default: the silencing) where `holds` does."""
        start = self.silenced_at if since is None else since
        return nf.first([x.s for x in self.snaps], holds, start)

    def events_about(self, reason: str, name: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("reason") == reason and (e.get("regarding") or {}).get("name") == name
        ]


def _workload_pods(x: Snap, name: str) -> list[str]:
    return [k for k, p in x.s.pods.items() if p.workload.endswith(f"/{name}")]


def _record(env: Env, stack: contextlib.ExitStack) -> Recording:
    ns = stack.enter_context(team_namespace(env, f"e2e-upstream-{uuid.uuid4().hex[:6]}", TEAM))
    tenant = tenant_of(env, ns)
    core = k8s.CoreV1Api(env.api)
    lost, spare = stack.enter_context(fault_zone(env, ZONE, 2))
    core.patch_node(spare, {"spec": {"unschedulable": True}})  # both pods go to `lost`
    stack.callback(core.patch_node, spare, {"spec": {"unschedulable": False}})
    custom = k8s.CustomObjectsApi(tenant.api)
    for body in (workload(ORDINARY, False), workload(AT_MOST_ONE, True)):
        custom.create_namespaced_custom_object(
            names.GROUP, names.VERSION, ns, "serviceworkloads", body
        )
    recorder = Recorder(env, ns)
    recorder.start()
    stack.callback(recorder.done.set)

    def placed() -> Snap | None:
        x = recorder.latest()
        if x is None:
            return None
        ready = [k for k, p in x.s.pods.items() if p.ready and p.node == lost]
        return x if len(ready) == 2 else None

    before = wait_until(f"both pods Ready on {lost}", placed, timeout=180)
    (ordinary,) = _workload_pods(before, ORDINARY)
    (held,) = _workload_pods(before, AT_MOST_ONE)
    core.patch_node(spare, {"spec": {"unschedulable": False}})
    renew = lease_renew_time(env, lost)
    assert isinstance(renew, datetime.datetime)
    notes: list[str] = []
    silenced_at = time.time()
    silence(env, lost)
    try:

        def both_replaced() -> bool:
            x = recorder.latest()
            if x is None:
                return False
            away = [nf.live_elsewhere(x.s, f"{ns}/{w}", [lost]) for w in (ORDINARY, AT_MOST_ONE)]
            return all(pods and all(x.s.pods[p].ready for p in pods) for pods in away)

        try:
            wait_until("both pods replaced on the spare node", both_replaced, SCENARIO_TIMEOUT)
        except AssertionError as e:  # the tests say what is missing from the recording
            notes.append(str(e))
    finally:
        restored_at = time.time()
        restore(env, lost)

    def returned() -> bool:
        x = recorder.latest()
        return bool(x and nf.returned(lost)(x.s) and not nf.pods_on(x.s, [lost]))

    try:
        wait_until(f"{lost} back, untainted and empty", returned, timeout=90)
    except AssertionError as e:
        notes.append(str(e))
    recorder.done.set()
    recorder.join(timeout=30)
    events = _items(k8s.EventsV1Api(env.api).list_namespaced_event(ns, _preload_content=False))
    # Silence starts at the last renewal before the node was restored (kwok may have renewed
    # once more before it saw the label change).
    silent = [x.s for x in recorder.snaps if x.s.done < restored_at]
    last_renewal = nf.last_renewal(silent, lost)
    return Recording(
        namespace=ns,
        lost=lost,
        spare=spare,
        ordinary=ordinary,
        held=held,
        renewed=max(renew.timestamp(), last_renewal or 0.0),
        silenced_at=silenced_at,
        restored_at=restored_at,
        snaps=list(recorder.snaps),
        events=events,
        notes=[*notes, *recorder.errors[:5]],
    )


@pytest.fixture(scope="module")
def failure(upstream_env: Env) -> Recording:
    with contextlib.ExitStack() as stack:
        return _record(upstream_env, stack)


def test_upstreams_controller_marks_the_silent_node(failure: Recording) -> None:
    f = failure
    mark = f.when(nf.unreachable(f.lost))
    assert mark is not None, f"{f.lost} never Unknown with the unreachable taints; {f.notes}"
    at_mark = next(x for x in f.snaps if x.s.done == mark.by)
    assert at_mark.ready_message[f.lost] == UPSTREAM_MESSAGE, "marked by upstream, not Pilotfish"
    assert not f.events_about("NodeUnreachable", f.lost), "Pilotfish does not mark in this mode"


def test_the_ordinary_pod_tolerates_a_lost_node_for_the_eviction_wait(failure: Recording) -> None:
    first = next(x for x in failure.snaps if failure.ordinary in x.tolerations)
    assert first.tolerations[failure.ordinary] == dict.fromkeys(LOST_NODE_TAINTS, EVICTION_WAIT)


def test_it_is_evicted_by_upstream_60s_after_the_taint_and_replaced(failure: Recording) -> None:
    f = failure
    tainted = next((x.tainted_at[f.lost] for x in f.snaps if f.lost in x.tainted_at), None)
    assert tainted is not None, f"{f.lost} never got the unreachable NoExecute taint; {f.notes}"
    evicted = f.when(nf.evicted([f.ordinary]))
    assert evicted is not None, f"{f.ordinary} never evicted; {f.notes}"
    # timeAdded is in whole seconds; upstream evicts at timeAdded + tolerationSeconds
    assert evicted.by - tainted >= EVICTION_WAIT - 1, evicted.since(tainted)
    assert evicted.after - tainted <= EVICTION_WAIT + 15, evicted.since(tainted)
    reasons = {x.s.pods[f.ordinary].disruption for x in f.snaps if f.ordinary in x.s.pods}
    assert reasons - {""} == {"DeletionByTaintManager"}, reasons
    replaced = f.when(nf.replaced({f"{f.namespace}/{ORDINARY}": 1}, [f.lost]), evicted.after)
    assert replaced is not None, f"no replacement bound away from {f.lost}; {f.notes}"


def test_the_at_most_one_pod_is_released_by_pilotfish_never_evicted_by_upstream(
    failure: Recording,
) -> None:
    f = failure
    held = [x.s.pods[f.held] for x in f.snaps if f.held in x.s.pods]
    assert {p.disruption for p in held} <= {""}, "upstream's taint manager evicted it"
    assert not f.events_about("TaintManagerEviction", f.held.split("/")[1])
    assert all(
        tol == dict.fromkeys(LOST_NODE_TAINTS)
        for x in f.snaps
        for p, tol in x.tolerations.items()
        if x.s.pods[p].workload.endswith(f"/{AT_MOST_ONE}")
    ), "an at-most-one pod tolerates a lost node forever"
    live = [
        [p for p in _workload_pods(x, AT_MOST_ONE) if not x.s.pods[p].terminating] for x in f.snaps
    ]
    assert max(len(pods) for pods in live) == 1, "two copies of the at-most-one pod at once"
    workload = f"{f.namespace}/{AT_MOST_ONE}"
    released = f.when(lambda s: bool(nf.live_elsewhere(s, workload, [f.lost])))
    assert released is not None, f"the at-most-one pod was never released; {f.notes}"
    assert released.by - f.renewed >= RELEASE_AFTER, released.since(f.renewed)
    after = next(x for x in f.snaps if x.s.done == released.by)
    (new,) = nf.live_elsewhere(after.s, workload, [f.lost])
    old_epoch = next(x.epochs[f.held] for x in f.snaps if f.held in x.epochs)
    assert int(after.epochs[new]) > int(old_epoch), (old_epoch, after.epochs[new])
    assert f.events_about("AtMostOneReleased", AT_MOST_ONE), "released by Pilotfish"


def test_the_node_returns_untainted_and_empty(failure: Recording) -> None:
    f = failure
    back = f.when(nf.returned(f.lost), f.restored_at)
    assert back is not None, f.notes
    assert nf.pods_on(f.snaps[-1].s, [f.lost]) == set(), f.notes


def test_system_pods_keep_upstreams_default(upstream_env: Env) -> None:
    """DefaultTolerationSeconds (before any webhook) gave it 300 s; kube-system is not a
    tenant namespace, so the webhook leaves it so, as it does Pilotfish's own pods."""
    core = k8s.CoreV1Api(upstream_env.api)
    name = f"e2e-upstream-sys-{uuid.uuid4().hex[:6]}"
    body = {
        "metadata": {"name": name, "annotations": {names.ANNOTATION_EPOCH: "1"}},
        "spec": {
            "containers": [{"name": "c", "image": "example/app:1"}],
            "nodeSelector": {names.LABEL_ZONE: "nowhere"},  # never runs
        },
    }
    created = core.create_namespaced_pod("kube-system", body)
    try:
        got = {t.key: t.toleration_seconds for t in created.spec.tolerations or []}
        assert got == dict.fromkeys(LOST_NODE_TAINTS, 300)
    finally:
        core.delete_namespaced_pod(name, "kube-system", grace_period_seconds=0)
