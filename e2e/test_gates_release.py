"""The gate controller against the real control plane: pods leave their gates when conditions
hold, in order, paced, all-or-nothing for gangs, expire loudly, and survive kill -9.

Pods are created already gated (gates, the gated label and the record annotation, built with
`PodGates(...).encode()`), and a GatePolicy that declares the same gates exists in the
namespace: so the tests hold whether or not the mutating webhook is running yet (it keeps
gates a pod already has and rewrites the record with the same terms), and the validating
webhook, which only admits Pilotfish gates that a policy declares, lets them through.
The namespaces opt out of the webhooks (`pilotfish.io/webhooks: disabled`, as the chart
allows the platform to do): the pods here carry teams and priority classes of the tests'
own, which admission refuses in tenant namespaces (a pod's team is its namespace's, its
class one of the Pilotfish bands'); what is tested is release, each pod admitted as written.

Nothing waits a fixed time: every wait polls for a state with a deadline, and "did not
happen" is only asserted after the controller has shown it looked (the pod's State
condition names what the pod waits for).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import NO_NODE, Env, wait_until
from pilotfish import gates, names, timeutil
from pilotfish.devcluster import supervisor
from pilotfish.gates import GateRecord, OnExpiry, PodGates
from pilotfish.operators.gates import audit

P = names.GATE_PREFIX
# A new operator waits for the killed one's lease (15 s) before it leads.
FAILOVER = 120.0
CRD = f"gatesignals.{names.GROUP}"


# --- helpers -------------------------------------------------------------------------------


def _now() -> datetime.datetime:
    return timeutil.SYSTEM_CLOCK.now()


def team_of(namespace: str) -> str:
    """A team of the test's own, so TeamQuotas of other tests never apply."""
    return "g" + hashlib.sha1(namespace.encode()).hexdigest()[:10]


def gate_spec(
    name: str,
    condition: dict[str, Any],
    timeout: int = 600,
    on_expiry: OnExpiry = "Fail",
    retry: dict[str, int] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": P + name,
        "condition": condition,
        "timeoutSeconds": timeout,
        "onExpiry": on_expiry,
    }
    if retry:
        out["retry"] = retry
    return out


def signal_gate(name: str, signal: str, **kw: Any) -> dict[str, Any]:
    return gate_spec(name, {"type": "GateSignal", "signalName": signal}, **kw)


class Gated:
    """One test's gated world: GatePolicies, pods, signals, quotas, and reading them back."""

    def __init__(self, env: Env, namespace: str) -> None:
        self.env = env
        self.ns = namespace
        self.core = k8s.CoreV1Api(env.api)
        self.custom = k8s.CustomObjectsApi(env.api)
        self.events_api = k8s.EventsV1Api(env.api)
        self.policies: dict[str, list[dict[str, Any]]] = {}
        self.uids: set[str] = set()  # of this test's pods (names repeat across runs)
        self.team = team_of(namespace)  # the test's own: no other test's TeamQuota applies
        self.cluster_objects: list[tuple[str, str]] = []

    # objects

    def policy(self, app: str, gates_: list[dict[str, Any]], **pacing: Any) -> None:
        spec: dict[str, Any] = {"selector": {"matchLabels": {"app": app}}, "gates": gates_}
        if pacing:
            spec["pacing"] = pacing
        self.custom.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            self.ns,
            "gatepolicies",
            {
                "apiVersion": names.API_VERSION,
                "kind": "GatePolicy",
                "metadata": {"name": app},
                "spec": spec,
            },
        )
        self.policies[app] = gates_

    def pod(
        self,
        name: str,
        app: str,
        *,
        cpu: str = "100m",
        team: str | None = None,
        priority_class: str | None = None,
        gang: str | None = None,
        node_selector: dict[str, str] | None = None,
    ) -> None:
        """Create a pod carrying every gate of its app's policy, with label and record."""
        now = _now()
        created = timeutil.format_time(now)
        records = {}
        for g in self.policies[app]:
            retry = g.get("retry") or {}
            records[g["name"]] = GateRecord(
                policy=app,
                generation=1,
                condition=g["condition"],
                timeout_seconds=g["timeoutSeconds"],
                deadline=timeutil.format_time(
                    now + datetime.timedelta(seconds=g["timeoutSeconds"])
                ),
                on_expiry=g["onExpiry"],
                initial_backoff_seconds=retry.get("initialBackoffSeconds", 10),
                max_backoff_seconds=retry.get("maxBackoffSeconds", 600),
            )
        # No band label and the test's own priority classes (the namespace opts out of
        # admission): the gate controller takes the default band, batch.
        labels = {"app": app, gates.LABEL_GATED: "true", names.LABEL_TEAM: team or self.team}
        if gang:
            labels[gates.LABEL_GANG] = gang
        spec: dict[str, Any] = {
            "schedulingGates": [{"name": n} for n in records],
            "containers": [
                {
                    "name": "app",
                    "image": "example/gated:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        }
        if priority_class:
            spec["priorityClassName"] = priority_class
        if node_selector:
            spec["nodeSelector"] = node_selector
        body = {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {
                    gates.ANNOTATION_CREATED: created,
                    gates.ANNOTATION_RECORD: PodGates(created, records).encode(),
                },
            },
            "spec": spec,
        }

        def create() -> bool:
            try:
                made = self.core.create_namespaced_pod(self.ns, body)
            except ApiException as e:
                # The webhooks may not have seen the new GatePolicy yet (503 while starting,
                # or a denial naming the undeclared gate): try again.
                if e.status in (400, 403, 503) or (e.status == 500 and "webhook" in str(e.body)):
                    return False
                raise
            self.uids.add(made.metadata.uid)
            return True

        wait_until(f"pod {name} admitted", create, timeout=60)

    def plain_pod(self, name: str, *, cpu: str, team: str) -> None:
        self.core.create_namespaced_pod(
            self.ns,
            {
                "metadata": {"name": name, "labels": {names.LABEL_TEAM: team}},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "example/plain:1",
                            "resources": {"requests": {"cpu": cpu}},
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        )

    def signal(self, name: str, ready: bool) -> None:
        try:
            self.custom.create_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                self.ns,
                "gatesignals",
                {"apiVersion": names.API_VERSION, "kind": "GateSignal", "metadata": {"name": name}},
            )
        except ApiException as e:
            if e.status != 409:
                raise
        status = "True" if ready else "False"
        condition = {
            "type": "Ready",
            "status": status,
            "reason": "Raised" if ready else "NotYet",
            "message": "set by the e2e test",
            "lastTransitionTime": timeutil.format_time(_now()),
        }
        self.custom.patch_namespaced_custom_object_status(
            names.GROUP,
            names.VERSION,
            self.ns,
            "gatesignals",
            name,
            {"status": {"conditions": [condition]}},
        )

    def team_quota(self, team: str, cpu: str) -> None:
        name = f"{team}-quota"
        self.custom.create_cluster_custom_object(
            names.GROUP,
            names.VERSION,
            "teamquotas",
            {
                "apiVersion": names.API_VERSION,
                "kind": "TeamQuota",
                "metadata": {"name": name},
                "spec": {"team": team, "bands": {"batch": {"cpu": cpu}}},
            },
        )
        self.cluster_objects.append(("teamquotas", name))

    def cleanup(self) -> None:
        for plural, name in self.cluster_objects:
            try:
                self.custom.delete_cluster_custom_object(names.GROUP, names.VERSION, plural, name)
            except ApiException as e:
                if e.status != 404:
                    raise

    # reading back

    def read(self, name: str) -> dict[str, Any] | None:
        try:
            resp = self.core.read_namespaced_pod(name, self.ns, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def must(self, name: str) -> dict[str, Any]:
        obj = self.read(name)
        assert obj is not None, f"pod {name} is gone"
        return obj

    def held(self, name: str) -> list[str]:
        return [g for g in gates.scheduling_gates(self.must(name)) if gates.is_pilotfish_gate(g)]

    def state(self, name: str) -> dict[str, Any] | None:
        obj = self.read(name)
        for c in ((obj or {}).get("status") or {}).get("conditions") or []:
            if c.get("type") == gates.POD_CONDITION:
                return dict(c)
        return None

    def wait_state(
        self, name: str, reason: str, says: str = "", timeout: float = 60
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            s = self.state(name)
            ok = s is not None and s.get("reason") == reason and says in str(s.get("message"))
            return s if ok else None

        return wait_until(f"{name} in state {reason} ({says})", check, timeout=timeout)

    def wait_unschedulable(self, name: str, timeout: float = 60) -> dict[str, Any]:
        """Released (no Pilotfish gate) and tried by the scheduler, which found no node."""

        def check() -> dict[str, Any] | None:
            obj = self.read(name)
            if obj is None or any(map(gates.is_pilotfish_gate, gates.scheduling_gates(obj))):
                return None
            for c in (obj.get("status") or {}).get("conditions") or []:
                if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return obj
            return None

        return wait_until(f"{name} released and Unschedulable", check, timeout=timeout)

    def wait_running(self, name: str, timeout: float = 60) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = self.read(name)
            return obj if obj and (obj.get("status") or {}).get("phase") == "Running" else None

        return wait_until(f"{name} Running", check, timeout=timeout)

    def events(self, reason: str) -> list[dict[str, Any]]:
        resp = self.events_api.list_namespaced_event(self.ns, _preload_content=False)
        items = json.loads(resp.data)["items"]
        found = [e for e in items if e.get("reason") == reason]
        return sorted(found, key=lambda e: str(e.get("eventTime")))

    def released_order(self) -> list[str]:
        """Pods in the order their releases were audited: each line is written once its
        gate patch was answered (GateReleased Events are one per round, not per pod)."""
        return [
            r["pod"].split("/", 1)[1] for r in self.audit_lines() if r["decision"] == "released"
        ]

    def after_creation_second_of(self, name: str) -> None:
        """Ages are compared by creationTimestamp, which has one-second resolution: wait
        until the clock has passed `name`'s second, so the next pod is strictly younger."""
        created = timeutil.parse_time(self.must(name)["metadata"]["creationTimestamp"])
        wait_until(
            f"a second after {name} was created",
            lambda: _now() >= created + datetime.timedelta(seconds=1),
            timeout=5,
            interval=0.05,
        )

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    def audit_lines(self) -> list[dict[str, Any]]:
        layout = self.env.require_local()
        return [r for r in audit.read(layout.logs / "gates-audit.jsonl") if r["uid"] in self.uids]


@pytest.fixture
def g(env: Env, namespace: str) -> Iterator[Gated]:
    core = k8s.CoreV1Api(env.api)
    # The namespace belongs to the test's own team, as the platform labels a tenant's: the
    # one quota ledger charges every pod to its namespace's team.
    labels = {names.LABEL_WEBHOOKS: names.WEBHOOKS_DISABLED, names.LABEL_TEAM: team_of(namespace)}
    core.patch_namespace(namespace, {"metadata": {"labels": labels}})
    probe = {
        "metadata": {"name": "probe", "labels": {names.LABEL_TEAM: "not-the-namespace-s"}},
        "spec": {"containers": [{"name": "c", "image": "example/probe:1"}]},
    }

    def left_alone() -> bool:
        try:
            core.create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as e:
            if e.status == 403:  # refused by the webhooks: they still see the namespace
                return False
            raise
        return True

    wait_until("the webhooks to leave the namespace alone", left_alone, timeout=30)
    world = Gated(env, namespace)
    try:
        yield world
    finally:
        world.cleanup()


@pytest.fixture(scope="module")
def signals_crd(env: Env) -> None:
    """The GateSignal CRD (another part of Pilotfish ships it): from the chart, else from
    crds/ in this checkout, else the tests that need it are skipped saying why."""
    ext = k8s.ApiextensionsV1Api(env.api)

    def established() -> bool:
        try:
            crd = ext.read_custom_resource_definition(CRD)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        )

    if established():
        return
    path = Path(__file__).resolve().parent.parent / "crds" / f"{CRD}.yaml"
    if not path.exists():
        pytest.skip(f"the GateSignal CRD is neither installed nor in {path.parent}")
    env.kubectl("apply", "-f", str(path))
    wait_until("the GateSignal CRD established", established, timeout=60)


@pytest.fixture(scope="module")
def priority_classes(env: Env) -> Iterator[dict[str, str]]:
    sched = k8s.SchedulingV1Api(env.api)
    made = {"high": "e2e-gates-high", "low": "e2e-gates-low"}
    for value, name in ((500, made["high"]), (100, made["low"])):
        try:
            sched.create_priority_class(
                {"metadata": {"name": name}, "value": value, "preemptionPolicy": "Never"}
            )
        except ApiException as e:
            if e.status != 409:
                raise
    yield made
    for name in made.values():
        sched.delete_priority_class(name)


def all_of(*checks: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: all(c() for c in checks)


# --- the scenarios -------------------------------------------------------------------------


def test_gatesignal_ready_releases_the_pod_to_running(g: Gated, signals_crd: None) -> None:
    g.policy("web", [signal_gate("data-ready", "data")])
    g.signal("data", ready=False)
    g.pod("p", "web")
    gated = g.wait_state("p", gates.STATE_GATED, "GateSignal data not Ready")
    assert gated["status"] == "False"
    assert not (g.must("p").get("spec") or {}).get("nodeName"), "the scheduler never saw it"

    g.signal("data", ready=True)
    running = g.wait_running("p")
    assert g.held("p") == []
    # The release was the gate patch alone: its mark says it, and the State condition is
    # the gated phase's, describing an older generation of the pod than the patch left.
    mark = json.loads(running["metadata"]["annotations"]["gates.pilotfish.io/released"])
    assert "GateSignal" in mark[P + "data-ready"]["evidence"]
    left = g.state("p")
    assert left is not None and left["reason"] == gates.STATE_GATED
    assert left["observedGeneration"] < running["metadata"]["generation"]
    [event] = wait_until("a GateReleased Event", lambda: g.events("GateReleased"), timeout=30)
    assert event["regarding"]["name"] == "p" and event["type"] == "Normal"
    assert "GateSignal" in event["note"] and event["reportingController"] == "pilotfish.io/gates"
    if g.env.layout is not None:
        [line] = wait_until("the audit line", g.audit_lines, timeout=30)
        assert (line["pod"], line["gate"], line["decision"]) == (
            f"{g.ns}/p",
            P + "data-ready",
            "released",
        )
        assert line["uid"] == g.must("p")["metadata"]["uid"]


def test_quota_gated_pods_go_by_priority_then_age_as_quota_frees(
    g: Gated, priority_classes: dict[str, str]
) -> None:
    team = g.team
    g.team_quota(team, cpu="1")
    g.plain_pod("holder", cpu="1", team=team)
    g.wait_running("holder")
    g.policy("batch", [gate_spec("quota", {"type": "Quota"})])
    g.pod("low-old", "batch", cpu="1", team=team, priority_class=priority_classes["low"])
    g.after_creation_second_of("low-old")
    g.pod("high-new", "batch", cpu="1", team=team, priority_class=priority_classes["high"])
    g.pod("low-new", "batch", cpu="1", team=team, priority_class=priority_classes["low"])
    for name in ("low-old", "high-new", "low-new"):
        g.wait_state(name, gates.STATE_GATED, f"quota of team {team}, band batch")
    assert g.released_order() == []

    expected = ["high-new", "low-old", "low-new"]
    running = "holder"
    for i, nxt in enumerate(expected):
        g.delete(running)  # frees the quota: the next in line goes, and only it
        g.wait_running(nxt)
        assert g.released_order() == expected[: i + 1]
        for later in expected[i + 1 :]:
            assert P + "quota" in g.held(later)
        running = nxt


def test_fair_share_and_in_flight_cap_per_tenant(g: Gated, signals_crd: None) -> None:
    """Released pods that cannot be placed stay in flight (Unschedulable): the cap stops
    further releases, and teams take turns although team a's pods are all older."""
    g.policy("fair", [signal_gate("go", "go")], releasesPerSecond=2, maxInFlight=4)
    g.signal("go", ready=False)
    previous = ""
    for name in ("a0", "a1", "a2", "b0", "b1", "b2"):
        if previous:
            g.after_creation_second_of(previous)  # strictly ordered ages
        g.pod(name, "fair", team=f"{g.team}-{name[0]}", node_selector=NO_NODE)
        previous = name
    for p in ("a0", "a1", "a2", "b0", "b1", "b2"):
        g.wait_state(p, gates.STATE_GATED, "GateSignal go not Ready")
    g.signal("go", ready=True)

    wait_until("4 releases", lambda: len(g.released_order()) >= 4, timeout=60)
    for p in ("a0", "b0", "a1", "b1"):
        g.wait_unschedulable(p)
    for p in ("a2", "b2"):
        g.wait_state(p, gates.STATE_GATED, "queued by the release pacing")
        assert g.held(p) == [P + "go"]
    # The burst (2) goes in the first round, whose writes run concurrently: compare it as a
    # set. Fair share shows in b0 going before the older a1, and b1 before the older a2.
    order = g.released_order()
    assert set(order[:2]) == {"a0", "b0"} and order[2:] == ["a1", "b1"], order

    g.delete("a0")
    g.delete("b0")  # two slots free: the rest go
    wait_until("6 releases", lambda: len(g.released_order()) == 6, timeout=60)
    assert set(g.released_order()[4:]) == {"a2", "b2"}


def test_gang_is_released_all_together(g: Gated, signals_crd: None) -> None:
    g.policy("gang", [signal_gate("data", "data"), gate_spec("gang", {"type": "Gang", "size": 3})])
    g.signal("data", ready=True)
    g.pod("m0", "gang", gang="g1")
    g.pod("m1", "gang", gang="g1")
    for m in ("m0", "m1"):
        g.wait_state(m, gates.STATE_GATED, "gang g1: 2/3 pods present")
        assert g.held(m) == [P + "gang"], "the met data gate goes at once, the gang gate stays"
    g.pod("m2", "gang", gang="g1")
    for m in ("m0", "m1", "m2"):
        g.wait_running(m)
    if g.env.layout is not None:
        gang_lines = wait_until(
            "3 gang releases audited",
            lambda: [r for r in g.audit_lines() if r["gate"] == P + "gang"][:3] or None,
            timeout=30,
        )
        rounds = {r["ts"] for r in gang_lines}
        assert len(gang_lines) == 3 and len(rounds) == 1, f"one round for the gang: {gang_lines}"


def test_expiry_fail_retry_and_review(g: Gated, signals_crd: None) -> None:
    g.policy("fail", [signal_gate("late", "never", timeout=3, on_expiry="Fail")])
    g.policy(
        "retry",
        [
            signal_gate(
                "late",
                "never",
                timeout=3,
                on_expiry="Retry",
                retry={"initialBackoffSeconds": 1, "maxBackoffSeconds": 2},
            )
        ],
    )
    g.policy("review", [signal_gate("late", "never", timeout=3, on_expiry="Review")])
    for app in ("fail", "retry", "review"):
        g.pod(f"{app}-pod", app)

    wait_until("the Fail pod deleted", lambda: g.read("fail-pod") is None, timeout=60)
    expired = wait_until("GateExpired Event", lambda: g.events("GateExpired"), timeout=30)
    assert expired[0]["regarding"]["name"] == "fail-pod" and expired[0]["type"] == "Warning"
    assert "onExpiry Fail" in expired[0]["note"]

    def retried_twice() -> int | None:
        rec = gates.read_record(g.must("retry-pod"))
        n = rec.gates[P + "late"].attempts if rec else 0
        return n if n >= 2 else None

    wait_until("two retries", retried_twice, timeout=60)
    assert g.held("retry-pod") == [P + "late"]
    assert g.events("GateRetry")

    review = wait_until(
        "review label",
        lambda: g.must("review-pod")["metadata"]["labels"].get(gates.LABEL_REVIEW) == "required",
        timeout=60,
    )
    assert review
    assert g.held("review-pod") == [P + "late"]
    g.wait_state("review-pod", gates.STATE_EXPIRED, "review")
    assert g.events("GateReview")

    if g.env.layout is not None:
        decisions = {(r["pod"].split("/")[1], r["decision"]) for r in g.audit_lines()}
        assert {
            ("fail-pod", "expired-fail"),
            ("retry-pod", "expired-retry"),
            ("review-pod", "expired-review"),
        } <= decisions
        assert not any(d == "released" for _, d in decisions), "expiry never removes a gate"


@pytest.mark.disruptive
def test_kill_9_mid_release_converges_without_double_release(g: Gated, signals_crd: None) -> None:
    env = g.env
    env.require_local()
    count = 24
    g.policy("bulk", [signal_gate("go", "go")], releasesPerSecond=4)
    g.signal("go", ready=False)
    pods = [f"bulk-{i:02d}" for i in range(count)]
    for p in pods:
        g.pod(p, "bulk")
    for p in pods:
        g.wait_state(p, gates.STATE_GATED, "GateSignal go not Ready")
    g.signal("go", ready=True)
    wait_until(
        "some releases",
        lambda: sum(r["decision"] == "released" for r in g.audit_lines()) >= 3,
        timeout=60,
    )
    killed_at = _now()
    env.kill("pilotfish-operator")  # SIGKILL, mid-release: the rate keeps most gated
    try:
        assert sum(r["decision"] == "released" for r in g.audit_lines()) < count
    finally:
        # Whatever happens, later tests need the operator. Its port can outlive the killed
        # process for a moment, and starting a new one before it is free fails.
        port = env.host_process("pilotfish-operator").port
        wait_until("the operator's port free", lambda: not supervisor.port_in_use(port), timeout=60)
        env.restart("pilotfish-operator")

    wait_until(
        "every pod ungated",
        lambda: all(g.held(p) == [] for p in pods),
        timeout=FAILOVER,
        interval=1.0,
    )
    for p in pods:
        g.wait_running(p)
    released = [r for r in g.audit_lines() if r["decision"] == "released"]
    per_pod: dict[str, int] = {}
    for r in released:
        assert r["gate"] == P + "go"
        per_pod[r["pod"]] = per_pod.get(r["pod"], 0) + 1
    assert per_pod == {f"{g.ns}/{p}": 1 for p in pods}, "each pod released exactly once"
    # The new process has the killed one's identity (it resumes the lease as its own), so
    # the release times tell the two apart.
    by_killed = [r for r in released if timeutil.parse_time(r["ts"]) < killed_at]
    assert 0 < len(by_killed) < count, "released partly by the killed, the rest by the new one"


def test_duplicate_removal_patches_are_harmless(g: Gated, signals_crd: None) -> None:
    """A removal applied twice (an on-call retry, a replayed request) removes that one gate
    once and touches no other gate. Applied with the operator's own identity: the API
    server lets no one else remove Pilotfish gates."""
    g.policy("dup", [signal_gate("data", "never-a"), signal_gate("hold", "never-b")])
    g.pod("p", "dup")
    g.wait_state("p", gates.STATE_GATED, "GateSignal never-a")
    operator = k8s.CoreV1Api(g.env.component_api("operator"))
    patch = gates.remove_gate_patch(P + "data")
    first = operator.patch_namespaced_pod("p", g.ns, patch)
    second = operator.patch_namespaced_pod("p", g.ns, patch)
    assert [x.name for x in first.spec.scheduling_gates] == [P + "hold"]
    assert [x.name for x in second.spec.scheduling_gates] == [P + "hold"]
    # The spec did not change again (the controller may write the status meanwhile).
    assert second.metadata.generation == first.metadata.generation
    g.wait_state("p", gates.STATE_GATED, f"waiting for {P}hold")
    assert g.held("p") == [P + "hold"]
    if g.env.layout is not None:
        assert g.audit_lines() == [], "the controller did not release what a person removed"
