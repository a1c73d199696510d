"""BatchWorkloads in e2e tests: submitting them, reading them back, and a kubelet's part.

A job's pods are followed by `e2e.taskwatch.TaskWatch`. `Tasks` plays the kubelet's last
word for each task pod once kwok runs it: succeed, fail, be preempted or be evicted, chosen
per (index, attempt) by the test. The templates ask kwok to keep the pods running
(`RUN_SECONDS` an hour), so only the test decides how a task ends.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Final, Literal

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, wait_until
from e2e.taskwatch import Seen, TaskWatch, attempt_of, index_of, running, terminal
from pilotfish import names
from pilotfish.workloads import FINALIZER_TASK, LABEL_BATCH

PLURAL: Final = "batchworkloads"
RUN_SECONDS: Final = "kwok.pilotfish.io/run-seconds"
# Long enough that kwok never finishes a task during a test: the test does (`Tasks`).
HELD: Final = {RUN_SECONDS: "3600"}

Outcome = Literal["succeed", "fail", "preempt", "evict"]
# What a kubelet reports for a pod deleted while it runs: its containers killed, phase Failed.
KILLED: Final = "killed"


def template(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {"app": "task"},
            "annotations": dict(HELD if annotations is None else annotations),
        },
        "spec": {
            "containers": [
                {
                    "name": "task",
                    "image": "example/task:1",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
        },
    }


def batchworkload(
    name: str, team: str, completions: int, parallelism: int, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": name},
        "spec": {
            "team": team,
            "completions": completions,
            "parallelism": parallelism,
            "template": template(),
            **spec,
        },
    }


def custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def create(api: k8s.ApiClient, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    made: dict[str, Any] = custom(api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, PLURAL, body
    )
    return made


def get(api: k8s.ApiClient, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom(api).get_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, PLURAL, name
    )
    return obj


def status(bw: dict[str, Any]) -> dict[str, Any]:
    return dict(bw.get("status") or {})


def condition(bw: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in status(bw).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def wait_condition(
    api: k8s.ApiClient,
    ns: str,
    name: str,
    type_: str,
    want: str = "True",
    reason: str | None = None,
    timeout: float = 120,
) -> dict[str, Any]:
    """The job once condition `type_` has status `want` (and `reason`, when given)."""

    def check() -> dict[str, Any] | None:
        bw = get(api, ns, name)
        c = condition(bw, type_)
        ok = c.get("status") == want and (reason is None or c.get("reason") == reason)
        return bw if ok else None

    try:
        return wait_until(f"{name} {type_}={want} ({reason or 'any reason'})", check, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; status {json.dumps(status(get(api, ns, name)))}") from None


class Tasks:
    """Ends each running task pod as `outcome(index, attempt)` says (None: leave it run).

    Writes are what a kubelet reports (status as the cluster admin) or, for "evict", a
    policy/v1 Eviction, as a drain would send. Each pod is ended at most once, and a pod
    deleted while it runs (by the Eviction, or by anyone) is reported killed, as its
    kubelet would once the container stopped."""

    def __init__(
        self,
        env: Env,
        watch: TaskWatch,
        outcome: Callable[[int, int], Outcome | None],
        workers: int = 4,
    ) -> None:
        self.core = k8s.CoreV1Api(env.api)
        self.watch = watch
        self.outcome = outcome
        self.done: dict[str, Outcome] = {}  # pod name -> what was done to it
        self.errors: list[str] = []
        self._handled: set[str] = set()
        self._killed: set[str] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tasks")
        watch.listeners.append(self._on_event)
        for p in watch.live_pods():  # pods already running before this was attached
            self._on_event(Seen(-1, time.monotonic(), "MODIFIED", p))

    def close(self) -> None:
        self.watch.listeners.remove(self._on_event)
        self._pool.shutdown(wait=True)

    def rescan(self) -> None:
        """Ask again for every live pod: `outcome` may answer differently now."""
        with self._lock:
            self._handled -= {p["metadata"]["uid"] for p in self.watch.live_pods()}
        for p in self.watch.live_pods():
            self._on_event(Seen(-1, time.monotonic(), "MODIFIED", p))

    def _on_event(self, seen: Seen) -> None:
        if seen.type == "DELETED":
            return
        if killed(seen.pod):
            with self._lock:
                if seen.uid in self._killed:
                    return
                self._killed.add(seen.uid)
            self._pool.submit(self._end, seen.name, KILLED)
            return
        if not running(seen.pod):
            return
        what = self.outcome(index_of(seen.pod), attempt_of(seen.pod))
        with self._lock:
            if what is None or seen.uid in self._handled:
                return
            self._handled.add(seen.uid)
        self._pool.submit(self._end, seen.name, what)

    def _end(self, name: str, what: Outcome | Literal["killed"]) -> None:
        try:
            if what == "evict":
                self.core.create_namespaced_pod_eviction(
                    name,
                    self.watch.ns,
                    {"metadata": {"name": name, "namespace": self.watch.ns}},
                )
            else:
                self.core.patch_namespaced_pod_status(name, self.watch.ns, ended(what))
        except ApiException as e:
            if e.status != 404:  # gone already: the operator removed it
                self.errors.append(f"{what} {name}: {e.status} {e.reason}")
                return
        if what != KILLED:
            with self._lock:
                self.done[name] = what


def killed(pod: dict[str, Any]) -> bool:
    """Deleted while it ran on a node: a kubelet stops it and reports it Failed (kwok's
    pod-delete stage only removes the pod, which a finalizer holds)."""
    return (
        bool(pod["metadata"].get("deletionTimestamp"))
        and bool(pod["spec"].get("nodeName"))
        and not terminal(pod)
    )


def ended(what: Outcome | Literal["killed"]) -> dict[str, Any]:
    """The status a kubelet reports for a task pod that ended as `what`."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    code = 0 if what == "succeed" else 1 if what == "fail" else 137
    terminated = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": now,
        "finishedAt": now,
    }
    body: dict[str, Any] = {
        "phase": "Succeeded" if what == "succeed" else "Failed",
        "containerStatuses": [
            {
                "name": "task",
                "image": "example/task:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"terminated": terminated},
            }
        ],
    }
    reason = "PodCompleted" if what == "succeed" else "PodFailed"
    body["conditions"] = [
        {"type": t, "status": "False", "reason": reason, "lastTransitionTime": now}
        for t in ("Ready", "ContainersReady")
    ]
    if what == "preempt":
        body["reason"] = "Preempted"
        body["message"] = "Preempted in order to admit a higher-priority pod"
        body["conditions"].append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": "pilotfish-scheduler: preempting to accommodate a higher priority pod",
                "lastTransitionTime": now,
            }
        )
    return {"status": body}


def all_succeed(index: int, attempt: int) -> Outcome:
    return "succeed"


@contextmanager
def job(
    env: Env,
    tenant: Tenant,
    body: dict[str, Any],
    outcome: Callable[[int, int], Outcome | None] = all_succeed,
) -> Iterator[tuple[TaskWatch, Tasks]]:
    """Submit `body` as the tenant, with its pods watched and ended as `outcome` says.

    A test that fails part-way leaves running tasks that no kubelet will end once `Tasks`
    stops, and their tracking finalizer would hold the namespace's deletion for ever: they
    are let go here."""
    name = body["metadata"]["name"]
    watch = TaskWatch(env, tenant.namespace, name)
    tasks = Tasks(env, watch, outcome)
    try:
        create(tenant.api, tenant.namespace, body)
        yield watch, tasks
    except BaseException:
        release_pods(env, tenant.namespace, name)
        raise
    finally:
        tasks.close()
        watch.stop()
    assert not tasks.errors and not watch.broken, (tasks.errors, watch.broken)


def release_pods(env: Env, ns: str, name: str) -> None:
    """Drop the tracking finalizer from the job's pods (cleanup after a failed test)."""
    core = k8s.CoreV1Api(env.api)
    for p in core.list_namespaced_pod(ns, label_selector=f"{LABEL_BATCH}={name}").items:
        kept = [f for f in p.metadata.finalizers or [] if f != FINALIZER_TASK]
        try:
            core.patch_namespaced_pod(p.metadata.name, ns, {"metadata": {"finalizers": kept}})
        except ApiException as e:
            if e.status != 404:
                raise


def pods_left(env: Env, ns: str, name: str) -> list[str]:
    core = k8s.CoreV1Api(env.api)
    items = core.list_namespaced_pod(ns, label_selector=f"{LABEL_BATCH}={name}").items
    return [p.metadata.name for p in items]
