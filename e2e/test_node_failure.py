"""Machine failure against the real control plane: one silent node among twelve is marked
unreachable at 40 s of lease silence, its endpoints drop with it, its pods are evicted 60 s
later and replaced elsewhere; a silent third of a zone is a partition, not a failure (the
zone brake: nothing evicted, every endpoint kept, a `ZoneBrake` Event); both return.

kwok plays the kubelets (`e2e.lostnodes`): a silenced node's lease stops renewing and its
pods stop changing. The nodes are this module's own, in zones of its own: `e2e-nf-a`,
`e2e-nf-b`, `e2e-nf-c` with 4 nodes each (the twelve), and `e2e-brake` with 6.

Both scenarios share one wait: one module fixture silences the lone node and two of the six
brake-zone nodes at the same moment, samples the cluster every 0.5 s into a recording
(`benchmarks.probes.nodefailure`: nodes' Ready, taints and lease renewal; pods with node,
readiness and deletion; EndpointSlice endpoints) until the lone node's pods are replaced and
the brake zone has outlived its would-be eviction time, restores all three and records their
return (the brake must hold while the zone heals too: its nodes come back one at a time).
The tests then read the recording.

Silence is measured from the node's last lease renewal: the lease's `renewTime` read from
the API just before silencing, or a later one if kwok renewed once more before it saw the
label change (the recording keeps every renewTime it read, so the last one is known); kwok
writes renewTime from this machine's wall clock, and the samples are timed with the same
clock. A change between two samples is placed in (earlier sample sent, later sample
answered], and the bounds are asserted on both ends of that interval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes import client as k8s

from benchmarks.probes import nodefailure as nf
from e2e.conftest import Env, team_namespace, tenant_of, wait_until
from e2e.lostnodes import fault_zone, lease_renew_time, restore, silence
from e2e.recorder import Recorder, items
from e2e.test_serviceworkload import service_workload
from pilotfish import names
from pilotfish.timeutil import parse_time
from pilotfish.workloads import DISRUPTION_NODE_LOST

pytestmark = [pytest.mark.e2e, pytest.mark.lostnodes]

LONE_ZONES: Final = ("e2e-nf-a", "e2e-nf-b", "e2e-nf-c")
BRAKE_ZONE: Final = "e2e-brake"
NODES_PER_LONE_ZONE: Final = 4
BRAKE_NODES: Final = 6
BRAKE_SILENT: Final = 2
# Workloads over the twelve nodes (name -> replicas) and the brake zone's one.
LONE_WORKLOADS: Final = {"web": 12, "api": 6}
BRAKE_WORKLOAD: Final = ("braked", 12)
TEAM: Final = "e2e"  # team_namespace's team, with an unlimited TeamQuota

UNREACHABLE_AFTER: Final = 40.0
EVICTION_WAIT: Final = 60.0
WITHIN: Final = 2.0  # unreachable within 2 s of 40 s; endpoints dropped within 2 s of that
EVICTED_WITHIN: Final = 3.0
REPLACED_BY: Final = UNREACHABLE_AFTER + EVICTION_WAIT + 5.0
READY_BY: Final = REPLACED_BY + 5.0
# The brake zone is watched past its would-be eviction time (40 + 60 s) by this much.
BRAKE_MARGIN: Final = 8.0
SCENARIO_TIMEOUT: Final = 150.0
RETURN_TIMEOUT: Final = 60.0
HEALED: Final = 5.0  # recorded on after the return


def workload(name: str, replicas: int, zones: list[str]) -> dict[str, Any]:
    return service_workload(
        name,
        TEAM,
        replicas,
        placement={"zones": zones},
        service={"ports": [{"name": "http", "port": 80}]},
    )


@dataclass
class Failure:
    """What the module fixture did and saw; the tests read it."""

    namespace: str
    zone_of: dict[str, str]  # this module's nodes
    lone: str
    brake_nodes: list[str]
    before: nf.Sample  # the last sample before silencing
    renewed_before: dict[str, float]  # node -> renewTime read just before silencing
    silenced_at: float
    restored_at: float
    samples: list[nf.Sample]
    events: list[dict[str, Any]]  # events.k8s.io/v1, every namespace, at the end
    notes: list[str] = field(default_factory=list)  # waits that timed out, recorder gaps

    @property
    def lone_pods(self) -> set[str]:
        return nf.pods_on(self.before, [self.lone])

    @property
    def brake_pods(self) -> set[str]:
        return nf.pods_on(self.before, self.brake_nodes)

    def renewed(self, node: str) -> float:
        """The node's last lease renewal: silence is measured from here."""
        last = nf.last_renewal(self.samples, node, self.restored_at)
        assert last is not None, f"the recording never saw {node}'s lease before its return"
        return last

    def when(
        self, holds: Callable[[nf.Sample], bool], since: float | None = None
    ) -> nf.When | None:
        return nf.first(self.samples, holds, self.silenced_at if since is None else since)

    def sample_at(self, when: nf.When) -> nf.Sample:
        return next(s for s in self.samples if s.done == when.by)

    def events_about(self, reason: str, names_: set[str], text: str | None = None) -> list[Any]:
        """Events of `reason` regarding one of `names_` (or whose note mentions `text`)."""
        return [
            e
            for e in self.events
            if e.get("reason") == reason
            and (
                (e.get("regarding") or {}).get("name") in names_
                or (text is not None and text in str(e.get("note") or ""))
            )
        ]


def _most_loaded(s: nf.Sample, nodes: list[str], count: int) -> list[str]:
    return sorted(nodes, key=lambda n: (-len(nf.pods_on(s, [n])), n))[:count]


def _last_seen(event: dict[str, Any]) -> float:
    stamps = [
        event.get("eventTime"),
        (event.get("series") or {}).get("lastObservedTime"),
        event.get("deprecatedLastTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ]
    return max((parse_time(str(t)).timestamp() for t in stamps if t), default=0.0)


def _events(env: Env, since: float) -> list[dict[str, Any]]:
    """Every Event last seen from `since` on (a kept cluster still has an earlier run's, about
    nodes of the same names)."""
    resp = k8s.EventsV1Api(env.api).list_event_for_all_namespaces(
        _preload_content=False, _request_timeout=30
    )
    return [e for e in items(resp) if _last_seen(e) >= math.floor(since)]


def _renew_time(env: Env, node: str) -> float:
    renew = lease_renew_time(env, node)
    assert isinstance(renew, datetime.datetime), (node, renew)
    return renew.timestamp()


def _record_failure(env: Env, stack: contextlib.ExitStack) -> Failure:
    """Set both scenarios up, silence their nodes together, wait both out, restore."""
    ns = stack.enter_context(team_namespace(env, f"e2e-node-failure-{uuid.uuid4().hex[:6]}", TEAM))
    tenant = tenant_of(env, ns)
    zone_of: dict[str, str] = {}
    sizes = [*((z, NODES_PER_LONE_ZONE) for z in LONE_ZONES), (BRAKE_ZONE, BRAKE_NODES)]
    for zone, count in sizes:
        zone_of |= dict.fromkeys(stack.enter_context(fault_zone(env, zone, count)), zone)
    twelve = [n for n, z in zone_of.items() if z in LONE_ZONES]
    brake_zone = [n for n, z in zone_of.items() if z == BRAKE_ZONE]
    custom = k8s.CustomObjectsApi(tenant.api)
    bodies = [workload(n, r, list(LONE_ZONES)) for n, r in LONE_WORKLOADS.items()]
    bodies.append(workload(BRAKE_WORKLOAD[0], BRAKE_WORKLOAD[1], [BRAKE_ZONE]))
    for body in bodies:
        custom.create_namespaced_custom_object(
            names.GROUP, names.VERSION, ns, "serviceworkloads", body
        )
    wanted = {f"{ns}/{w}": n for w, n in [*LONE_WORKLOADS.items(), BRAKE_WORKLOAD]}
    lone_wanted = {f"{ns}/{w}": n for w, n in LONE_WORKLOADS.items()}  # as their Services
    recorder = stack.enter_context(Recorder(env, ns, [*LONE_ZONES, BRAKE_ZONE]))

    def all_ready() -> nf.Sample | None:
        s = recorder.latest()
        return s if s and nf.full_ready(wanted)(s) else None

    wait_until("every workload at full ready count", all_ready, timeout=180)
    notes: list[str] = []

    def waited(what: str, check: Callable[[], bool], timeout: float) -> None:
        try:
            wait_until(what, check, timeout)
        except AssertionError as e:  # the tests say what is missing from the recording
            notes.append(str(e))

    before = all_ready()
    assert before is not None
    lone = _most_loaded(before, twelve, 1)[0]
    braked = _most_loaded(before, brake_zone, BRAKE_SILENT)
    silent = [lone, *braked]
    renewed_before = {node: _renew_time(env, node) for node in silent}
    silenced_at = time.time()
    try:
        for node in silent:
            silence(env, node)
        window_end = max(renewed_before.values()) + UNREACHABLE_AFTER + EVICTION_WAIT

        def scenarios_over() -> bool:
            s = recorder.latest()
            return bool(
                s
                and s.at >= window_end + BRAKE_MARGIN
                and nf.replaced(lone_wanted, [lone])(s)
                and nf.full_ready(lone_wanted)(s)
            )

        waited("replacements and the end of the brake window", scenarios_over, SCENARIO_TIMEOUT)
    finally:
        restored_at = time.time()
        for node in silent:
            restore(env, node)

    def returned() -> bool:
        s = recorder.latest()
        return bool(s and all(nf.returned(n)(s) for n in silent) and not nf.pods_on(s, [lone]))

    waited("the silenced nodes back, the lone one empty", returned, RETURN_TIMEOUT)
    # A few seconds of the healed cluster too: what the return sets off (a braked zone's
    # last silent node judged alone once its peers are back) shows a moment later.
    healed = time.time()
    waited("the healed cluster recorded", lambda: recorder.past(healed + HEALED), 30)
    recorder.stop()
    return Failure(
        namespace=ns,
        zone_of=zone_of,
        lone=lone,
        brake_nodes=braked,
        before=before,
        renewed_before=renewed_before,
        silenced_at=silenced_at,
        restored_at=restored_at,
        samples=list(recorder.samples),
        events=_events(env, silenced_at),
        notes=[*notes, *recorder.errors[:5]],
    )


@pytest.fixture(scope="module")
def failure(env: Env) -> Failure:
    """Both scenarios, recorded; the nodes and namespace are gone once it returns.
    PILOTFISH_E2E_RECORDING=path also writes the recording there (JSON), to read a failure."""
    with contextlib.ExitStack() as stack:
        recorded = _record_failure(env, stack)
    dump = os.environ.get("PILOTFISH_E2E_RECORDING")
    if dump:
        body = {k: v for k, v in dataclasses.asdict(recorded).items() if k != "events"}
        Path(dump).write_text(json.dumps(body, default=sorted, indent=1))
    return recorded


def test_a_lone_silent_node_is_unreachable_within_2s_of_40s(failure: Failure) -> None:
    f = failure
    assert f.lone_pods, f"no pod on {f.lone} to lose"
    renewed = f.renewed(f.lone)
    assert renewed >= f.renewed_before[f.lone]
    mark = f.when(nf.unreachable(f.lone))
    assert mark is not None, f"{f.lone} never Unknown with both unreachable taints; {f.notes}"
    assert mark.after - renewed >= UNREACHABLE_AFTER - WITHIN, mark.since(renewed)
    assert mark.by - renewed <= UNREACHABLE_AFTER + WITHIN, mark.since(renewed)
    assert f.events_about("NodeUnreachable", {f.lone}), f"no NodeUnreachable Event on {f.lone}"


def test_its_endpoints_drop_at_once(failure: Failure) -> None:
    f = failure
    renewed = f.renewed(f.lone)
    mark = f.when(nf.unreachable(f.lone))
    dropped = f.when(nf.endpoints_dropped(f.lone_pods))
    assert mark is not None and dropped is not None, (mark, dropped, f.notes)
    # Not before the node is called unreachable, and at most WITHIN after.
    assert dropped.after - renewed >= UNREACHABLE_AFTER - WITHIN, dropped.since(renewed)
    assert dropped.by - mark.by <= WITHIN, (dropped.since(renewed), mark.since(renewed))


def test_its_pods_are_evicted_60s_later_and_replaced_on_the_other_nodes(failure: Failure) -> None:
    f = failure
    renewed = f.renewed(f.lone)
    evicted = f.when(nf.evicted(f.lone_pods))
    assert evicted is not None, f"pods of {f.lone} never evicted; {f.notes}"
    due = UNREACHABLE_AFTER + EVICTION_WAIT
    assert evicted.after - renewed >= due - WITHIN, evicted.since(renewed)
    assert evicted.by - renewed <= due + EVICTED_WITHIN, evicted.since(renewed)
    reasons = {s.pods[p].disruption for s in f.samples for p in f.lone_pods if p in s.pods}
    assert reasons - {""} == {DISRUPTION_NODE_LOST}, reasons
    assert f.events_about("PodsEvicted", {f.lone}), f"no PodsEvicted Event on {f.lone}"
    lone_workloads = {f"{f.namespace}/{w}": n for w, n in LONE_WORKLOADS.items()}
    bound = f.when(nf.replaced(lone_workloads, [f.lone]), evicted.after)
    assert bound is not None, f"no replacements bound; {f.notes}"
    assert bound.by - renewed <= REPLACED_BY, bound.since(renewed)
    ready = f.when(nf.full_ready(lone_workloads), evicted.after)
    assert ready is not None, f"the services never back at full ready count; {f.notes}"
    assert ready.by - renewed <= READY_BY, ready.since(renewed)
    at_ready = f.sample_at(ready)
    placed = {
        at_ready.pods[p].node for w in lone_workloads for p in nf.live_elsewhere(at_ready, w, [])
    }
    others = {n for n, z in f.zone_of.items() if z in LONE_ZONES} - {f.lone}
    assert placed <= others, placed


def test_a_silent_third_of_a_zone_brakes_no_pod_evicted_no_endpoint_removed(
    failure: Failure,
) -> None:
    f = failure
    for node in f.brake_nodes:
        assert nf.pods_on(f.before, [node]), f"no pod on {node}: the brake would protect nothing"
    last_renewal = max(f.renewed(n) for n in f.brake_nodes)
    assert last_renewal <= f.silenced_at + 1.0, "the brake zone's leases kept renewing"
    due = last_renewal + UNREACHABLE_AFTER + EVICTION_WAIT
    assert f.restored_at >= due + BRAKE_MARGIN / 2, f"restored before evictions were due; {f.notes}"
    # The whole recording: silent, and healing (a zone's nodes come back one by one; the
    # last ones back are no lone failures either).
    evicted = nf.ever_evicted(f.samples, f.brake_pods, f.silenced_at)
    assert evicted == [], f"evicted in a braked zone: {evicted}"
    zone_nodes = {n for n, z in f.zone_of.items() if z == BRAKE_ZONE}
    assert not f.events_about("PodsEvicted", zone_nodes), f.events_about("PodsEvicted", zone_nodes)
    assert nf.ever_not_ready(f.samples, f.brake_pods, f.silenced_at) == []
    assert nf.ever_dropped(f.samples, f.brake_pods, f.silenced_at) == []
    assert f.events_about("ZoneBrake", zone_nodes, BRAKE_ZONE), [
        e for e in f.events if e.get("reason") == "ZoneBrake"
    ]
    lone_zone = f.zone_of[f.lone]
    lone_zone_nodes = {n for n, z in f.zone_of.items() if z == lone_zone}
    assert not f.events_about("ZoneBrake", lone_zone_nodes, lone_zone), (
        "one silent node is a machine failure, not a partition"
    )


def test_the_nodes_return_untainted_and_ready_the_lone_one_empty(failure: Failure) -> None:
    f = failure
    for node in [f.lone, *f.brake_nodes]:
        assert f.when(nf.returned(node), f.restored_at) is not None, (node, f.notes)
    last = f.samples[-1]
    assert nf.pods_on(last, [f.lone]) == set(), nf.pods_on(last, [f.lone])
    assert f.brake_pods <= set(last.pods), f.brake_pods - set(last.pods)
    assert all(last.pods[p].ready and not last.pods[p].terminating for p in f.brake_pods)
