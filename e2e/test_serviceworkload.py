"""ServiceWorkloads against the real control plane: replicas, scaling, rollouts within the
budget, stalls, pause/resume/undo, drains, and an operator killed mid-rollout.

Pods are scheduled by the real kube-scheduler onto kwok nodes, which mark them Running and
Ready at once. A readiness delay therefore cannot come from a readinessGate (kwok's fast
pod-ready stage sets every readinessGate condition True together with Ready); instead the
rolled-out template carries a scheduling gate of the test's own (`GATE`), which a helper
thread removes from each pod `delay` seconds after it appears. Until then the pod is not
scheduled, so not Ready: from the controller's side exactly a pod that is slow to become
ready. A template that never becomes ready selects a node label no node has.

Every rollout test watches the workload's pods in a background thread from a list onwards
(no event missed) and checks the budget on every state it observes: never more than
replicas + maxSurge pods that are not terminated (terminating and draining included), never
fewer than replicas - maxUnavailable available (Ready, not draining, not terminating).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from e2e.conftest import NO_NODE, Env, run, wait_until
from pilotfish import names
from pilotfish.devcluster import supervisor
from pilotfish.operators.serviceworkload.revisions import template_hash
from pilotfish.timeutil import SYSTEM_CLOCK, format_micro_time, parse_time
from pilotfish.workloads import (
    ANNOTATION_DRAIN,
    ANNOTATION_DRAINED,
    LABEL_REVISION,
    LABEL_WORKLOAD,
    PROPAGATION_SECONDS,
)

PLURAL = "serviceworkloads"
GATE = "e2e.example.com/ready-after"  # the test's own scheduling gate: a readiness delay
JSON_PATCH = "application/json-patch+json"
PLUGIN = str(Path(sys.executable).parent / "kubectl-pilotfish")


def template(image: str = "example/app:1", *, gated: bool = False, **spec: Any) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "containers": [
            {
                "name": "app",
                "image": image,
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }
        ],
        "terminationGracePeriodSeconds": 5,
        **spec,
    }
    if gated:
        pod_spec["schedulingGates"] = [{"name": GATE}]
    return {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec}


def team_of(namespace: str) -> str:
    """The test's own team, so no other test's TeamQuota applies."""
    return "sw" + hashlib.sha1(namespace.encode()).hexdigest()[:10]


@pytest.fixture
def ns(env: Env, namespace: str) -> Iterator[str]:
    """A namespace whose team may run production pods: admission refuses pods of a band no
    TeamQuota grants (fail closed), so each test grants its own team the production band."""
    team = team_of(namespace)
    core = k8s.CoreV1Api(env.api)
    core.patch_namespace(namespace, {"metadata": {"labels": {names.LABEL_TEAM: team}}})
    quotas = custom(env)
    quotas.create_cluster_custom_object(
        names.GROUP,
        names.VERSION,
        "teamquotas",
        {
            "apiVersion": names.API_VERSION,
            "kind": "TeamQuota",
            "metadata": {"name": team},
            "spec": {"team": team, "bands": {"production": {}}},
        },
    )
    probe = {
        "metadata": {
            "name": "probe",
            "labels": {names.LABEL_TEAM: team, names.LABEL_BAND: "production"},
        },
        "spec": {"containers": [{"name": "c", "image": "example/probe:1"}]},
    }

    def admitted() -> bool:
        try:
            core.create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as e:
            if e.status == 403:
                return False
            raise
        return True

    wait_until(f"TeamQuota {team} visible to admission", admitted, timeout=30)
    try:
        yield namespace
    finally:
        try:
            quotas.delete_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", team)
        except ApiException as e:
            if e.status != 404:
                raise


def service_workload(name: str, team: str, replicas: int, **spec: Any) -> dict[str, Any]:
    """A ServiceWorkload of `team` running `template()` unless `spec` says otherwise."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name},
        "spec": {"team": team, "replicas": replicas, "template": template(), **spec},
    }


def workload(name: str, ns: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return service_workload(name, team_of(ns), replicas, **spec)


def custom(env: Env) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(env.api)


def get_sw(env: Env, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom(env).get_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, PLURAL, name
    )
    return obj


def create_sw(env: Env, ns: str, body: dict[str, Any]) -> None:
    custom(env).create_namespaced_custom_object(names.GROUP, names.VERSION, ns, PLURAL, body)


def patch_spec(env: Env, ns: str, name: str, spec: dict[str, Any]) -> None:
    custom(env).patch_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, PLURAL, name, {"spec": spec}
    )


def set_template(env: Env, ns: str, name: str, tpl: dict[str, Any]) -> None:
    """Replace the whole template (a merge patch would merge into the old one)."""
    custom(env).patch_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        ns,
        PLURAL,
        name,
        [{"op": "replace", "path": "/spec/template", "value": tpl}],
        _content_type=JSON_PATCH,
    )


def condition(sw: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (sw.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


def pods_of(env: Env, ns: str, name: str) -> list[k8s.V1Pod]:
    """Live pods: neither terminated nor being deleted."""
    pods = (
        k8s.CoreV1Api(env.api)
        .list_namespaced_pod(ns, label_selector=f"{LABEL_WORKLOAD}={name}")
        .items
    )
    return [
        p
        for p in pods
        if not p.metadata.deletion_timestamp and p.status.phase not in ("Failed", "Succeeded")
    ]


def is_ready(pod: k8s.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def ready_pods(env: Env, ns: str, name: str) -> list[k8s.V1Pod]:
    return [p for p in pods_of(env, ns, name) if is_ready(p)]


def rolled_out(env: Env, ns: str, name: str) -> dict[str, Any] | None:
    sw = get_sw(env, ns, name)
    status = sw.get("status") or {}
    progressing = condition(sw, "Progressing")
    done = (
        status.get("observedGeneration") == sw["metadata"]["generation"]
        and progressing.get("status") == "True"
        and progressing.get("reason") == "RolloutComplete"
    )
    return sw if done else None


def wait_rolled_out(env: Env, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    return wait_until(f"{name} rolled out", lambda: rolled_out(env, ns, name), timeout=timeout)


def plugin(env: Env, ns: str, *args: str) -> Any:
    return run(
        [PLUGIN, "--kubeconfig", str(env.kubeconfig), "-n", ns, "rollout", *args], check=False
    )


def ready_workload(env: Env, ns: str, name: str, replicas: int, **spec: Any) -> None:
    create_sw(env, ns, workload(name, ns, replicas, **spec))
    env.kubectl("-n", ns, "wait", "--for=condition=Available", f"sw/{name}", "--timeout=120s")
    wait_rolled_out(env, ns, name)


# -- background helpers -----------------------------------------------------------------------


def _pod_watch(
    env: Env, ns: str, selector: str, stop: threading.Event
) -> Iterator[tuple[str, Any]]:
    """(event type, pod) for every pod matching, starting with a list, until `stop`; after
    the list's pods comes ("LISTED", None): a consistent state to check from then on.
    A watch that expires (410) is resumed from a fresh list, with DELETED for the pods
    gone meanwhile, so the consumer's view never keeps a pod that no longer exists."""
    core = k8s.CoreV1Api(env.api)
    known: dict[str, Any] = {}
    listed = core.list_namespaced_pod(ns, label_selector=selector)
    for pod in listed.items:
        known[pod.metadata.name] = pod
        yield "ADDED", pod
    yield "LISTED", None
    rv = listed.metadata.resource_version
    while not stop.is_set():
        w = watch.Watch()
        try:
            for event in w.stream(
                core.list_namespaced_pod,
                ns,
                label_selector=selector,
                resource_version=rv,
                timeout_seconds=2,
            ):
                pod = event["object"]
                rv = pod.metadata.resource_version
                if event["type"] == "DELETED":
                    known.pop(pod.metadata.name, None)
                else:
                    known[pod.metadata.name] = pod
                yield event["type"], pod
                if stop.is_set():
                    break
        except ApiException as e:
            if e.status != 410:
                raise
            listed = core.list_namespaced_pod(ns, label_selector=selector)
            rv = listed.metadata.resource_version
            fresh = {p.metadata.name: p for p in listed.items}
            for name in [n for n in known if n not in fresh]:
                yield "DELETED", known.pop(name)
            for name, pod in fresh.items():
                known[name] = pod
                yield "MODIFIED", pod
        finally:
            w.stop()


@dataclass
class BudgetWatch:
    """Checks the rollout budget on every observed state of the workload's pods."""

    env: Env
    ns: str
    name: str
    max_pods: int
    min_available: int
    pods: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    max_seen: int = 0
    revisions_seen: set[str] = field(default_factory=set)
    states: int = 0
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def counted(self) -> int:
        return sum(1 for p in self.pods.values() if p.status.phase not in ("Failed", "Succeeded"))

    def available(self) -> int:
        return sum(
            1
            for p in self.pods.values()
            if is_ready(p)
            and not p.metadata.deletion_timestamp
            and ANNOTATION_DRAIN not in (p.metadata.annotations or {})
        )

    def _run(self) -> None:
        try:
            listed = False
            for kind, pod in _pod_watch(
                self.env, self.ns, f"{LABEL_WORKLOAD}={self.name}", self.stop
            ):
                if kind == "LISTED":
                    listed = True
                    self.check("the initial list")
                    continue
                if kind == "DELETED":
                    self.pods.pop(pod.metadata.name, None)
                else:
                    self.pods[pod.metadata.name] = pod
                    self.revisions_seen.add(pod.metadata.labels.get(LABEL_REVISION, ""))
                if listed:
                    self.check(f"{kind} {pod.metadata.name}")
        except BaseException as e:  # surfaced by finish()
            self.error = e

    def check(self, what: str) -> None:
        self.states += 1
        counted, available = self.counted(), self.available()
        self.max_seen = max(self.max_seen, counted)
        if counted > self.max_pods:
            self.violations.append(f"after {what}: {counted} pods > {self.max_pods}")
        if available < self.min_available:
            self.violations.append(f"after {what}: {available} available < {self.min_available}")

    def __enter__(self) -> BudgetWatch:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_until("the budget watch listing", lambda: self.states > 0, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=15)

    def finish(self) -> None:
        self.__exit__()
        if self.error:
            raise self.error
        assert not self.violations, self.violations[:10]


@dataclass
class GateReleaser:
    """Removes GATE from each pod `delay` seconds after it is first seen: a readiness delay."""

    env: Env
    ns: str
    delay: float
    released: set[str] = field(default_factory=set)
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def _release(self, name: str, due: float) -> None:
        if self.stop.wait(max(0.0, due - time.monotonic())):
            return
        core = k8s.CoreV1Api(self.env.api)
        try:
            pod = core.read_namespaced_pod(name, self.ns)
            gates = [g.name for g in pod.spec.scheduling_gates or []]
            if GATE not in gates or pod.metadata.deletion_timestamp:
                return
            i = gates.index(GATE)
            core.patch_namespaced_pod(
                name,
                self.ns,
                [
                    {"op": "test", "path": f"/spec/schedulingGates/{i}/name", "value": GATE},
                    {"op": "remove", "path": f"/spec/schedulingGates/{i}"},
                ],
                _content_type=JSON_PATCH,
            )
            self.released.add(name)
        except ApiException as e:
            if e.status != 404:
                self.error = e

    def _run(self) -> None:
        seen: set[str] = set()
        try:
            for kind, pod in _pod_watch(self.env, self.ns, LABEL_WORKLOAD, self.stop):
                if pod is None:
                    continue
                name = pod.metadata.name
                gated = any(g.name == GATE for g in pod.spec.scheduling_gates or [])
                if kind == "DELETED" or name in seen or not gated:
                    continue
                seen.add(name)
                t = threading.Thread(
                    target=self._release, args=(name, time.monotonic() + self.delay), daemon=True
                )
                t.start()
                self.threads.append(t)
        except BaseException as e:
            self.error = e

    def __enter__(self) -> GateReleaser:
        t = threading.Thread(target=self._run, daemon=True)
        t.start()
        self.threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=15)
        if self.error:
            raise self.error


# -- tests ------------------------------------------------------------------------------------


def test_a_workload_runs_ready_pods_and_becomes_available(env: Env, ns: str) -> None:
    ready_workload(env, ns, "web", 3)
    pods = ready_pods(env, ns, "web")
    assert len(pods) == 3
    h = template_hash(get_sw(env, ns, "web")["spec"]["template"])
    sw = get_sw(env, ns, "web")
    for p in pods:
        assert p.status.phase == "Running" and p.spec.node_name.startswith("kwok-")
        assert p.metadata.name.startswith(f"web-{h}-")
        labels = p.metadata.labels
        assert labels[LABEL_WORKLOAD] == "web" and labels[LABEL_REVISION] == h
        assert labels[names.LABEL_TEAM] == team_of(ns) and labels[names.LABEL_BAND] == "production"
        (ref,) = p.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid) == ("ServiceWorkload", "web", sw["metadata"]["uid"])
        assert ref.controller and ref.block_owner_deletion
    status = sw["status"]
    assert status["replicas"] == status["readyReplicas"] == status["availableReplicas"] == 3
    assert status["updatedReplicas"] == 3
    assert status["currentRevision"] == status["updateRevision"] == h
    assert status["selector"] == f"{LABEL_WORKLOAD}=web"
    assert condition(sw, "Stalled")["status"] == "False"

    row = env.kubectl("-n", ns, "get", "sw", "web", "--no-headers").stdout.split()
    assert row[:7] == ["web", team_of(ns), "production", "3", "3", "3", "3"], row

    rev = k8s.AppsV1Api(env.api).read_namespaced_controller_revision(f"web-{h}", ns)
    assert rev.revision == 1 and rev.metadata.owner_references[0].uid == sw["metadata"]["uid"]
    pdb = k8s.PolicyV1Api(env.api).read_namespaced_pod_disruption_budget("web", ns)
    assert pdb.spec.max_unavailable == 1
    assert pdb.spec.selector.match_labels == {LABEL_WORKLOAD: "web"}

    res = plugin(env, ns, "status", "web", "--timeout", "30s")
    assert res.returncode == 0 and "successfully rolled out" in res.stdout, res


def test_kubectl_scale_up_and_down(env: Env, ns: str) -> None:
    ready_workload(env, ns, "web", 2)
    env.kubectl("-n", ns, "scale", "sw", "web", "--replicas=5")
    wait_until("5 ready pods", lambda: len(ready_pods(env, ns, "web")) == 5, timeout=90)
    wait_until(
        "status of 5",
        lambda: (get_sw(env, ns, "web").get("status") or {}).get("availableReplicas") == 5,
    )
    env.kubectl("-n", ns, "scale", "sw", "web", "--replicas=1")
    wait_until("1 pod left", lambda: len(pods_of(env, ns, "web")) == 1, timeout=90)
    sw = wait_rolled_out(env, ns, "web")
    assert sw["status"]["replicas"] == 1
    scale = env.kubectl("-n", ns, "get", "sw", "web", "-o", "jsonpath={.spec.replicas}")
    assert scale.stdout == "1"


def test_failed_and_deleted_pods_are_replaced(env: Env, ns: str) -> None:
    ready_workload(env, ns, "web", 3)
    core = k8s.CoreV1Api(env.api)
    first, second, _ = sorted(p.metadata.name for p in pods_of(env, ns, "web"))
    core.delete_namespaced_pod(first, ns)
    core.patch_namespaced_pod_status(
        second, ns, {"status": {"phase": "Failed", "reason": "Evicted"}}
    )

    def replaced() -> bool:
        live = {p.metadata.name for p in ready_pods(env, ns, "web")}
        return len(live) == 3 and not live & {first, second}

    wait_until("replacements", replaced, timeout=90)
    wait_until(
        "the failed pod deleted",
        lambda: all(
            p.metadata.name != second or p.metadata.deletion_timestamp
            for p in core.list_namespaced_pod(ns).items
        ),
        timeout=60,
    )


@pytest.mark.parametrize(("replicas", "surge", "unavailable"), [(4, 1, 0), (5, 2, 1)])
def test_a_slow_rollout_never_breaks_the_budget(
    env: Env, ns: str, replicas: int, surge: int, unavailable: int
) -> None:
    strategy = {"maxSurge": surge, "maxUnavailable": unavailable}
    ready_workload(env, ns, "web", replicas, strategy=strategy)
    new = template("example/app:2", gated=True)
    with (
        BudgetWatch(env, ns, "web", replicas + surge, replicas - unavailable) as budget,
        GateReleaser(env, ns, delay=1.5) as releaser,
    ):
        set_template(env, ns, "web", new)
        res = plugin(env, ns, "status", "web", "--timeout", "180s")
        assert res.returncode == 0, res
        wait_until(
            "only new pods",
            lambda: (
                {p.metadata.labels[LABEL_REVISION] for p in pods_of(env, ns, "web")}
                == {template_hash(new)}
                and len(ready_pods(env, ns, "web")) == replicas
            ),
            timeout=60,
        )
        budget.finish()
    assert len(releaser.released) >= replicas, "every new pod waited behind the gate"
    assert budget.max_seen == replicas + surge, "the surge was used (the watch saw the rollout)"
    assert template_hash(new) in budget.revisions_seen
    history = plugin(env, ns, "history", "web")
    assert history.returncode == 0
    assert [line.split()[0] for line in history.stdout.splitlines()[2:]] == ["1", "2"]


def test_a_never_ready_rollout_stalls_with_old_pods_serving_and_undo_recovers(
    env: Env, ns: str
) -> None:
    strategy = {"maxSurge": 1, "maxUnavailable": 0, "progressDeadlineSeconds": 10}
    ready_workload(env, ns, "web", 3, strategy=strategy)
    old_hash = template_hash(get_sw(env, ns, "web")["spec"]["template"])
    broken = template("example/app:broken", nodeSelector=NO_NODE)
    with BudgetWatch(env, ns, "web", 4, 3) as budget:
        set_template(env, ns, "web", broken)

        def stalled() -> dict[str, Any] | None:
            sw = get_sw(env, ns, "web")
            return sw if condition(sw, "Stalled").get("status") == "True" else None

        sw = wait_until("Stalled", stalled, timeout=90)
        assert condition(sw, "Stalled")["reason"] == "ProgressDeadlineExceeded"
        assert condition(sw, "Progressing")["status"] == "False"
        assert condition(sw, "Progressing")["reason"] == "ProgressDeadlineExceeded"
        assert condition(sw, "Available")["status"] == "True"
        pods = pods_of(env, ns, "web")
        by_rev = sorted(p.metadata.labels[LABEL_REVISION] for p in pods)
        assert by_rev == sorted([old_hash] * 3 + [template_hash(broken)]), "stopped at the surge"
        assert len([p for p in pods if is_ready(p)]) == 3, "the old pods keep serving"

        res = plugin(env, ns, "status", "web", "--timeout", "20s")
        assert res.returncode == 1 and "stalled" in res.stderr, res

        undo = plugin(env, ns, "undo", "web")
        assert undo.returncode == 0 and "rolled back to revision 1" in undo.stdout, undo
        sw = wait_rolled_out(env, ns, "web")
        budget.finish()
    assert condition(sw, "Stalled")["status"] == "False"
    assert {p.metadata.labels[LABEL_REVISION] for p in pods_of(env, ns, "web")} == {old_hash}
    revs = k8s.AppsV1Api(env.api).read_namespaced_controller_revision(f"web-{old_hash}", ns)
    assert revs.revision == 3, "undo reuses the old revision, renumbered"


def test_pause_holds_the_rollout_scaling_continues_resume_finishes(env: Env, ns: str) -> None:
    ready_workload(env, ns, "web", 3)
    old_hash = template_hash(get_sw(env, ns, "web")["spec"]["template"])
    res = plugin(env, ns, "pause", "web")
    assert res.returncode == 0 and "paused" in res.stdout, res
    new = template("example/app:2")
    set_template(env, ns, "web", new)

    def paused_observed() -> dict[str, Any] | None:
        sw = get_sw(env, ns, "web")
        seen = sw.get("status", {}).get("observedGeneration") == sw["metadata"]["generation"]
        reason = condition(sw, "Progressing").get("reason")
        return sw if seen and reason == "RolloutPaused" else None

    sw = wait_until("the paused rollout observed", paused_observed, timeout=60)
    assert condition(sw, "Progressing")["status"] == "Unknown"
    # The controller acts before it writes status: what it did for this generation exists.
    assert {p.metadata.labels[LABEL_REVISION] for p in pods_of(env, ns, "web")} == {old_hash}
    env.kubectl("-n", ns, "scale", "sw", "web", "--replicas=4")
    wait_until("4 ready pods", lambda: len(ready_pods(env, ns, "web")) == 4, timeout=90)
    assert {p.metadata.labels[LABEL_REVISION] for p in pods_of(env, ns, "web")} == {old_hash}, (
        "while paused, new replicas run the stable revision"
    )

    res = plugin(env, ns, "resume", "web")
    assert res.returncode == 0, res
    wait_rolled_out(env, ns, "web")
    pods = ready_pods(env, ns, "web")
    assert len(pods) == 4
    assert {p.metadata.labels[LABEL_REVISION] for p in pods} == {template_hash(new)}


@dataclass(frozen=True)
class Deletion:
    """A pod as first seen being deleted: what it carried and what the API server recorded."""

    seen_at: float
    annotations: dict[str, str]
    # deletionTimestamp is the API server's own clock at the delete plus the grace period,
    # in whole seconds (metav1.Time).
    deletion_timestamp: datetime.datetime | None
    grace_seconds: int


def deletion_events(env: Env, ns: str, pod: str) -> list[dict[str, Any]]:
    resp = k8s.EventsV1Api(env.api).list_namespaced_event(ns, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
    return [
        e
        for e in items
        if (e.get("regarding") or {}).get("name") == pod
        and e.get("reportingController") == "pilotfish.io/serviceworkload"
        and e.get("action") == "DeletePod"
    ]


def test_pods_leave_rotation_before_they_are_deleted(env: Env, ns: str) -> None:
    """The drain contract: drain-requested-at first, delete only PROPAGATION_SECONDS after
    drained-at. The test answers drains itself (as the endpoints controller does) in case
    that controller is not running; if it is, whichever answers first is what counts.

    "Not before the deadline" is read from the pod itself: its drained-at annotation and
    the deletionTimestamp the API server stamped when it accepted the controller's delete,
    not from when this test happened to see the delete (which lags, and would hide an
    early delete)."""
    service = {"ports": [{"name": "http", "port": 80}]}
    ready_workload(env, ns, "web", 2, service=service)
    core = k8s.CoreV1Api(env.api)
    drain_seen: dict[str, float] = {}
    deleted_seen: dict[str, Deletion] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            for kind, pod in _pod_watch(env, ns, f"{LABEL_WORKLOAD}=web", stop):
                if pod is None:
                    continue
                name = pod.metadata.name
                annotations = dict(pod.metadata.annotations or {})
                if ANNOTATION_DRAIN in annotations and name not in drain_seen:
                    drain_seen[name] = time.time()
                    if ANNOTATION_DRAINED not in annotations:
                        stamp = format_micro_time(SYSTEM_CLOCK.now())
                        try:
                            core.patch_namespaced_pod(
                                name,
                                ns,
                                {"metadata": {"annotations": {ANNOTATION_DRAINED: stamp}}},
                            )
                        except ApiException as e:
                            if e.status != 404:
                                raise
                meta = pod.metadata
                if (kind == "DELETED" or meta.deletion_timestamp) and name not in deleted_seen:
                    deleted_seen[name] = Deletion(
                        time.time(),
                        annotations,
                        meta.deletion_timestamp,
                        int(meta.deletion_grace_period_seconds or 0),
                    )
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    try:
        env.kubectl("-n", ns, "scale", "sw", "web", "--replicas=1")
        wait_until("1 pod left", lambda: len(pods_of(env, ns, "web")) == 1, timeout=90)
        wait_until("the deletion observed", lambda: len(deleted_seen) == 1, timeout=30)
    finally:
        stop.set()
        t.join(timeout=15)
    assert not errors, errors
    ((victim, deletion),) = deleted_seen.items()
    assert victim in drain_seen and drain_seen[victim] <= deletion.seen_at, "drained first"
    drained = deletion.annotations.get(ANNOTATION_DRAINED)
    assert drained, "the pod was deleted with its drain answered"
    requested = parse_time(deletion.annotations[ANNOTATION_DRAIN])
    assert requested <= parse_time(drained), "the answer came after the request"
    assert deletion.deletion_timestamp is not None, "a graceful delete of a running pod"
    deadline = parse_time(drained) + datetime.timedelta(seconds=PROPAGATION_SECONDS)
    accepted = deletion.deletion_timestamp - datetime.timedelta(seconds=deletion.grace_seconds)
    # `accepted` is truncated to the second: the delete came at most 1 s after it.
    assert accepted + datetime.timedelta(seconds=1) > deadline, (
        f"{victim} deleted at {accepted} (API server), before drained-at + "
        f"{PROPAGATION_SECONDS:g}s = {deadline}"
    )
    # And for that reason: the answered drain, not its timeout or "not serving".
    reasons = wait_until(
        "the delete's Event",
        lambda: [e["reason"] for e in deletion_events(env, ns, victim)] or None,
        timeout=30,
    )
    assert reasons == ["PodDrained"], reasons


@pytest.mark.disruptive
def test_operator_killed_mid_rollout_converges_within_the_surge(env: Env, ns: str) -> None:
    env.require_local()
    replicas, surge = 6, 2
    strategy = {"maxSurge": surge, "maxUnavailable": 0}
    ready_workload(env, ns, "web", replicas, strategy=strategy)
    new = template("example/app:2", gated=True)
    new_hash = template_hash(new)
    with (
        BudgetWatch(env, ns, "web", replicas + surge, replicas) as budget,
        GateReleaser(env, ns, delay=1.0),
    ):
        set_template(env, ns, "web", new)
        wait_until("a new pod", lambda: new_hash in budget.revisions_seen, timeout=60)
        env.kill("pilotfish-operator")
        # `kill` returns once the process is a zombie; its threads may still hold the
        # metrics port for a moment, and `restart` refuses a port in use.
        port = env.host_process("pilotfish-operator").port
        wait_until("the operator's port free", lambda: not supervisor.port_in_use(port), 30)
        env.restart("pilotfish-operator")
        sw = wait_rolled_out(env, ns, "web", timeout=180)
        budget.finish()
    pods = ready_pods(env, ns, "web")
    assert len(pods) == replicas
    assert {p.metadata.labels[LABEL_REVISION] for p in pods} == {new_hash}
    assert sw["status"]["updatedReplicas"] == replicas
    print(json.dumps({"states_observed": budget.states, "max_pods_seen": budget.max_seen}))
