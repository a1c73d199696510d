"""The batch operator on the real control plane, end to end in one pass: a BatchWorkload of
50 tasks written with kubectl runs to Complete, every index once, and `kubectl get bw` shows
it; specs the API server must refuse are refused naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from pilotfish import names
from pilotfish.workloads import LABEL_BATCH

TASKS = 50


def manifest(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> str:
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": name},
        "spec": {
            "team": "e2e",
            "completions": TASKS,
            "parallelism": 20,
            "template": {
                "metadata": {"labels": {"app": "smoke"}, "annotations": annotations or {}},
                "spec": {
                    "containers": [
                        {
                            "name": "task",
                            "image": "example/task:1",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            },
            **spec,
        },
    }
    return json.dumps(body)


def finish_running(core: k8s.CoreV1Api, namespace: str, name: str) -> None:
    """The kubelet's last word for tasks kwok leaves running (as the cluster admin)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_BATCH}={name}").items
    for pod in pods:
        if pod.status.phase == "Running":
            try:
                core.patch_namespaced_pod_status(
                    pod.metadata.name, namespace, {"status": {"phase": "Succeeded"}}
                )
            except ApiException as e:
                if e.status != 404:
                    raise


def test_fifty_tasks_complete(env: Env, namespace: str) -> None:
    env.kubectl("-n", namespace, "apply", "-f", "-", input=manifest("smoke"))
    custom = k8s.CustomObjectsApi(env.api)
    core = k8s.CoreV1Api(env.api)
    seen_live: dict[str, set[str]] = {}

    def done() -> dict[str, Any] | None:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_BATCH}=smoke").items
        for pod in pods:
            if pod.status.phase not in ("Succeeded", "Failed"):
                index = pod.metadata.labels["pilotfish.io/task-index"]
                seen_live.setdefault(index, set()).add(pod.metadata.name)
        live = [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]
        per_index = [p.metadata.labels["pilotfish.io/task-index"] for p in live]
        assert len(per_index) == len(set(per_index)), f"two live pods on an index: {per_index}"
        finish_running(core, namespace, "smoke")
        bw = custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, "batchworkloads", "smoke"
        )
        conditions = {
            c["type"]: c["status"] for c in (bw.get("status") or {}).get("conditions", [])
        }
        return bw if conditions.get("Complete") == "True" else None

    bw = wait_until("the 50-task BatchWorkload to complete", done, timeout=180, interval=0.5)
    status = bw["status"]
    assert status["succeeded"] == TASKS and status["failed"] == 0
    assert status["completedIndexes"] == f"0-{TASKS - 1}"
    assert status["observedGeneration"] == bw["metadata"]["generation"]
    assert all(len(v) == 1 for v in seen_live.values())
    shown = env.kubectl("-n", namespace, "get", "bw", "smoke").stdout
    assert "Complete" in shown and f"{TASKS}" in shown
    wait_until(
        "the finished job's pods to be cleaned up",
        lambda: (
            not core.list_namespaced_pod(namespace, label_selector=f"{LABEL_BATCH}=smoke").items
        ),
        timeout=60,
    )


def test_invalid_specs_are_refused_naming_the_field(env: Env, namespace: str) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"completions": -1}, "spec.completions"),
        ({"backoffLimitPerIndex": -1}, "spec.backoffLimitPerIndex"),
        ({"parallelism": 20, "completions": 10, "gang": 12}, "spec.gang"),
    ]
    for spec, field in cases:
        res = env.kubectl(
            "-n", namespace, "apply", "-f", "-", input=manifest("bad", **spec), check=False
        )
        assert res.returncode != 0 and field in res.stderr, (spec, res.stderr)
    ok = env.kubectl(
        "-n",
        namespace,
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input=manifest("wide", completions=5, parallelism=50),
    )
    assert ok.returncode == 0  # parallelism above completions is fine


def test_an_evicted_task_is_recreated_without_counting(env: Env, namespace: str) -> None:
    """kwok keeps these tasks running (an hour) and never reports an evicted pod's end: the
    operator records the eviction from its DisruptionTarget condition and lets it go."""
    held = {"kwok.pilotfish.io/run-seconds": "3600"}
    body = manifest("evict", held, completions=2, parallelism=2, backoffLimit=0)
    env.kubectl("-n", namespace, "apply", "-f", "-", input=body)
    core = k8s.CoreV1Api(env.api)
    custom = k8s.CustomObjectsApi(env.api)

    def running(name: str) -> bool:
        return bool(core.read_namespaced_pod(name, namespace).status.phase == "Running")

    wait_until("evict-0-0 running", lambda: running("evict-0-0"), timeout=60)
    core.create_namespaced_pod_eviction(
        "evict-0-0",
        namespace,
        {"metadata": {"name": "evict-0-0", "namespace": namespace}},
    )
    wait_until("the replacement evict-0-1 running", lambda: running("evict-0-1"), timeout=60)

    def status() -> dict[str, Any]:
        bw = custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, "batchworkloads", "evict"
        )
        found: dict[str, Any] = bw.get("status") or {}
        return found

    assert (status().get("disrupted"), status().get("failed")) == (1, 0), status()

    def complete() -> bool:
        finish_running(core, namespace, "evict")
        return any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in status().get("conditions", [])
        )

    wait_until("the job to complete", complete, timeout=60)


def test_a_waiting_production_pod_holds_creation_until_it_is_placed(
    env: Env, namespace: str
) -> None:
    """A production pod no node fits waits for placement: no task pod is created meanwhile,
    `why` says so, and the job starts once that pod is gone."""
    core = k8s.CoreV1Api(env.api)
    custom = k8s.CustomObjectsApi(env.api)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "priorityClassName": names.PRIORITY_CLASS["production"],
                "nodeSelector": {"example.com/no-such-node": "true"},
                "containers": [{"name": "web", "image": "example/web:1"}],
            },
        },
    )
    env.kubectl("-n", namespace, "apply", "-f", "-", input=manifest("held", completions=3))

    def held() -> dict[str, Any] | None:
        bw = custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, "batchworkloads", "held"
        )
        pacing = (bw.get("status") or {}).get("pacing") or {}
        return bw if (pacing.get("heldForProduction") or 0) >= 1 else None

    wait_until("the job held for the production pod", held, timeout=30, interval=0.5)
    tasks = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_BATCH}=held").items
    assert tasks == []
    plugin = Path(sys.executable).parent / "kubectl-pilotfish"
    why = subprocess.run(
        [str(plugin), "--kubeconfig", str(env.kubeconfig), "why", "bw/held", "-n", namespace],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert why.returncode == 0, why.stderr
    assert "production pods waiting for placement" in why.stdout, why.stdout
    core.delete_namespaced_pod("web", namespace)

    def ran() -> bool:
        bw = custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, "batchworkloads", "held"
        )
        status = bw.get("status") or {}
        return status.get("succeeded") == 3 and status.get("pacing") is None

    wait_until("the job run once production is placed", ran, timeout=30, interval=0.5)


def test_a_namespace_deleted_under_a_running_job_goes_away(env: Env, namespace: str) -> None:
    """Failed tasks backing off (each kept for its replacement's failure count) and running
    ones: the namespace's deletion lets go of every task pod, so it does not hang."""
    core = k8s.CoreV1Api(env.api)
    custom = k8s.CustomObjectsApi(env.api)
    body = manifest(
        "doomed",
        {"kwok.pilotfish.io/exit-code": "1"},
        completions=4,
        parallelism=4,
        backoffLimit=50,
    )
    env.kubectl("-n", namespace, "apply", "-f", "-", input=body)

    def failed() -> bool:
        bw = custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, "batchworkloads", "doomed"
        )
        return bool(((bw.get("status") or {}).get("failed") or 0) >= 1)

    wait_until("a task failure recorded", failed, timeout=60, interval=0.5)
    core.delete_namespace(namespace)

    def gone() -> bool:
        try:
            core.read_namespace(namespace)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    wait_until("the namespace to be deleted", gone, timeout=90, interval=1)
