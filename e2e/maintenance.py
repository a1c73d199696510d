"""NodeMaintenances in e2e tests: creating and reading them, and a recording of the drain.

`Recorder` samples the test's pods, its zone's nodes and the NodeMaintenance every 0.5 s in
a background thread into `benchmarks.probes.maintenance` samples, so every invariant (the
budget, the concurrency, at most one copy) is checked on every state seen, afterwards, from
one recording while the test waits for the drain's end.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from benchmarks.probes import maintenance as probe
from e2e.conftest import Env, wait_until
from pilotfish import names

PLURAL: Final = "nodemaintenances"
SAMPLE_EVERY: Final = 0.5
OPERATOR_USER: Final = names.service_account_user(names.SYSTEM_NAMESPACE, names.SA_OPERATOR)


def body(name: str, nodes: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodes": nodes, **spec},
    }


def custom(env: Env) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(env.api)


def create(env: Env, obj: dict[str, Any]) -> None:
    custom(env).create_cluster_custom_object(names.GROUP, names.VERSION, PLURAL, obj)


def get(env: Env, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom(env).get_cluster_custom_object(
        names.GROUP, names.VERSION, PLURAL, name
    )
    return obj


def delete(env: Env, name: str) -> None:
    with contextlib.suppress(ApiException):
        custom(env).delete_cluster_custom_object(names.GROUP, names.VERSION, PLURAL, name)


def gone(env: Env, name: str) -> bool:
    try:
        get(env, name)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def status(nm: dict[str, Any]) -> dict[str, Any]:
    return dict(nm.get("status") or {})


def condition(nm: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in status(nm).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def node_status(nm: dict[str, Any], node: str) -> dict[str, Any]:
    return next((dict(n) for n in status(nm).get("nodes") or [] if n.get("name") == node), {})


def wait_phase(env: Env, name: str, phase: str, timeout: float = 180) -> dict[str, Any]:
    """The NodeMaintenance once its phase is `phase`; the status it had at the deadline is
    part of the failure."""

    def check() -> dict[str, Any] | None:
        nm = get(env, name)
        return nm if status(nm).get("phase") == phase else None

    try:
        return wait_until(f"{name} phase {phase}", check, timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; status {json.dumps(status(get(env, name)))}") from None


@contextlib.contextmanager
def removed(env: Env, name: str) -> Iterator[None]:
    """Delete the NodeMaintenance after the block whatever happens (its finalizer uncordons
    what it cordoned), and wait until it is gone, so the test's nodes go with nothing held."""
    try:
        yield
    finally:
        delete(env, name)
        with contextlib.suppress(AssertionError):
            wait_until(f"{name} deleted", lambda: gone(env, name), timeout=60)


def events_of(env: Env, name: str, reason: str) -> list[dict[str, Any]]:
    """events.k8s.io/v1 Events about the NodeMaintenance with `reason` (any namespace: a
    cluster-scoped object's Events go where the poster puts them). Read raw: the client's
    models refuse Events other components write without an eventTime."""
    resp = k8s.EventsV1Api(env.api).list_event_for_all_namespaces(_preload_content=False)
    return [
        e
        for e in _raw(resp)
        if e.get("reason") == reason
        and (e.get("regarding") or {}).get("kind") == "NodeMaintenance"
        and (e.get("regarding") or {}).get("name") == name
    ]


def wait_budget(env: Env, namespace: str, name: str, timeout: float = 120) -> None:
    """Wait until PodDisruptionBudget `name` allows a disruption, so a drain measured next
    is judged by the budget and not by the disruption controller's lag.

    In a fresh cluster kube-controller-manager learns of the ServiceWorkload kind only at its
    next discovery refresh (every 30 s); a budget synced before fails ("no matches for
    kind", reason SyncFailed) and is retried with a backoff that doubles from 5 ms, minutes
    by then. Touching it (an annotation) queues it again at once."""
    policy = k8s.PolicyV1Api(env.api)
    touched = [0.0]

    def allows() -> bool:
        resp = policy.read_namespaced_pod_disruption_budget(name, namespace, _preload_content=False)
        pdb = json.loads(resp.data)
        if probe.budget_allows(pdb, 1):
            return True
        if probe.budget_sync_failed(pdb) and time.monotonic() - touched[0] > 5:
            touched[0] = time.monotonic()
            note = {"metadata": {"annotations": {"e2e.pilotfish.io/resync": f"{time.time():.0f}"}}}
            policy.patch_namespaced_pod_disruption_budget(name, namespace, note)
        return False

    wait_until(f"budget {namespace}/{name} allowing a disruption", allows, timeout=timeout)


def node(env: Env, name: str) -> k8s.V1Node:
    return k8s.CoreV1Api(env.api).read_node(name)


def node_annotations(env: Env, name: str) -> dict[str, str]:
    return dict(node(env, name).metadata.annotations or {})


def unschedulable(env: Env, name: str) -> bool:
    return bool(node(env, name).spec.unschedulable)


def cordon(env: Env, name: str, on: bool = True) -> None:
    k8s.CoreV1Api(env.api).patch_node(name, {"spec": {"unschedulable": on or None}})


def _raw(resp: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


@dataclass
class Recorder:
    """Every SAMPLE_EVERY s: the pods of `namespace`, the nodes of `zone` and NodeMaintenance
    `maintenance` (when it exists), as one `probe.Sample`. A failed read is a gap in the
    recording, listed in `errors`; the test checks there were few."""

    env: Env
    namespace: str
    zone: str
    maintenance: str
    samples: list[probe.Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def take(self) -> probe.Sample:
        core = k8s.CoreV1Api(self.env.api)
        at = time.time()
        pods = _raw(core.list_namespaced_pod(self.namespace, _preload_content=False))
        selector = f"{names.LABEL_ZONE}={self.zone}"
        nodes = _raw(core.list_node(label_selector=selector, _preload_content=False))
        try:
            nm: dict[str, Any] | None = get(self.env, self.maintenance)
        except ApiException as e:
            if e.status != 404:
                raise
            nm = None
        return probe.sample(at, pods, nodes, nm)

    def _run(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                self.samples.append(self.take())
            except Exception as e:  # a gap, not a test failure: reported by `gaps`
                self.errors.append(f"{type(e).__name__}: {e}")
            self.stop.wait(max(0.0, SAMPLE_EVERY - (time.monotonic() - began)))

    @contextlib.contextmanager
    def running(self) -> Iterator[Recorder]:
        thread = threading.Thread(target=self._run, daemon=True, name="maintenance-recorder")
        thread.start()
        try:
            wait_until("a first sample", lambda: self.samples, timeout=30)
            yield self
            # The record ends with a sample begun after the block did: the last step a test
            # waited for (a pod evicted and gone, the drain Done) can fall between two samples.
            ended = time.time()
            wait_until("a sample after the end", lambda: self.samples[-1].at >= ended, timeout=30)
        finally:
            self.stop.set()
            thread.join(timeout=10)

    def latest(self) -> probe.Sample:
        return self.samples[-1]

    def check_gaps(self) -> None:
        """Few failed samples (an operator restart may cost one or two), or the invariants
        were not checked throughout."""
        assert len(self.errors) <= max(2, len(self.samples) // 20), self.errors[:5]


@dataclass(frozen=True)
class PodWrite:
    verb: str
    subresource: str  # "eviction", "" for the pod itself
    pod: str
    code: int


@dataclass
class Audit:
    """The operator's pod writes in a namespace from the API server's audit log (local
    cluster), from the moment `begin` was called: how the drain removed pods, not only
    that they went."""

    path: Path
    start: int

    @classmethod
    def begin(cls, env: Env) -> Audit | None:
        """None when the cluster is not the local one (no audit log to read)."""
        if env.layout is None:
            return None
        path = env.layout.logs / "audit.log"
        return cls(path, path.stat().st_size)

    def pod_writes(self, namespace: str) -> list[PodWrite]:
        with self.path.open("rb") as f:
            f.seek(self.start)
            lines = f.read().split(b"\n")
        found = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:  # the half-written last line
                continue
            ref = event.get("objectRef") or {}
            if (
                event.get("stage") != "ResponseComplete"
                or (event.get("user") or {}).get("username") != OPERATOR_USER
                or ref.get("resource") != "pods"
                or ref.get("namespace") != namespace
            ):
                continue
            code = int((event.get("responseStatus") or {}).get("code") or 0)
            found.append(
                PodWrite(event["verb"], ref.get("subresource") or "", ref.get("name") or "", code)
            )
        return found

    def evicted(self, namespace: str) -> set[str]:
        """Pods the operator evicted (201)."""
        return {
            w.pod
            for w in self.pod_writes(namespace)
            if w.subresource == "eviction" and w.code == 201
        }

    def deleted(self, namespace: str) -> list[str]:
        """Pods the operator deleted outright: never the drain's way."""
        return [
            w.pod for w in self.pod_writes(namespace) if w.verb == "delete" and not w.subresource
        ]
