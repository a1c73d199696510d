"""kwok plays batch tasks: a Job's or a BatchWorkload's running pod ends as its annotations say.

Plain pods created by the admin with an ownerReference (not a controller reference) to a
real, suspended owner: the owner's controller leaves them alone, the garbage collector keeps
them (the owner exists), and only kwok's stages move them.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from pilotfish import names
from pilotfish.devcluster.stages import ANNOTATION_EXIT_CODE, ANNOTATION_RUN_SECONDS

TEAM = "e2e"  # the `namespace` fixture's team, granted every band


def _owner_ref(kind: str, api_version: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"]}


@pytest.fixture
def job(env: Env, namespace: str) -> Iterator[dict[str, Any]]:
    """An ownerReference to a suspended Job, which never creates or claims a pod."""
    body = {
        "metadata": {"name": "owner"},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "example/task:1"}],
                }
            },
        },
    }
    created = k8s.BatchV1Api(env.api).create_namespaced_job(namespace, body)
    yield _owner_ref("Job", "batch/v1", env.api.sanitize_for_serialization(created))


@pytest.fixture
def batchworkload(env: Env, namespace: str) -> dict[str, Any]:
    """An ownerReference to a suspended BatchWorkload, which creates no task."""
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": "owner"},
        "spec": {
            "team": TEAM,
            "completions": 1,
            "suspend": True,
            "template": {"spec": {"containers": [{"name": "c", "image": "example/task:1"}]}},
        },
    }
    created = k8s.CustomObjectsApi(env.api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, "batchworkloads", body
    )
    return _owner_ref("BatchWorkload", names.API_VERSION, created)


@pytest.fixture
def serviceworkload(env: Env, namespace: str) -> dict[str, Any]:
    """An ownerReference to a ServiceWorkload of no replicas."""
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": "owner"},
        "spec": {
            "team": TEAM,
            "replicas": 0,
            "template": {"spec": {"containers": [{"name": "c", "image": "example/app:1"}]}},
        },
    }
    created = k8s.CustomObjectsApi(env.api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, "serviceworkloads", body
    )
    return _owner_ref("ServiceWorkload", names.API_VERSION, created)


def _task(name: str, owner: dict[str, Any] | None, **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": annotations}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "metadata": meta,
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "main", "image": "example/task:1"},
                {"name": "side", "image": "example/side:1"},
            ],
        },
    }


def _create(env: Env, namespace: str, body: dict[str, Any]) -> None:
    wait_until(
        f"pod {body['metadata']['name']} admitted",
        lambda: k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, body),
        timeout=30,
    )


def _phase(env: Env, namespace: str, name: str, phase: str, timeout: float = 60) -> k8s.V1Pod:
    core = k8s.CoreV1Api(env.api)

    def reached() -> k8s.V1Pod | None:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == phase else None

    pod: k8s.V1Pod = wait_until(f"{name} {phase}", reached, timeout=timeout)
    return pod


def _terminated(pod: k8s.V1Pod) -> list[k8s.V1ContainerStateTerminated]:
    statuses = pod.status.container_statuses or []
    assert sorted(s.name for s in statuses) == ["main", "side"], statuses
    return [s.state.terminated for s in statuses]


def test_task_pod_without_annotations_succeeds_at_once(
    env: Env, namespace: str, job: dict[str, Any], batchworkload: dict[str, Any]
) -> None:
    for name, owner in (("job-task", job), ("bw-task", batchworkload)):
        _create(env, namespace, _task(name, owner))
    for name in ("job-task", "bw-task"):
        pod = _phase(env, namespace, name, "Succeeded")
        assert all(t and t.exit_code == 0 and t.reason == "Completed" for t in _terminated(pod))
        ready = {c.type: c for c in pod.status.conditions}["Ready"]
        assert ready.status == "False" and ready.reason == "PodCompleted"


def test_task_runs_for_its_seconds_then_succeeds(
    env: Env, namespace: str, batchworkload: dict[str, Any]
) -> None:
    _create(env, namespace, _task("slow", batchworkload, **{ANNOTATION_RUN_SECONDS: "4"}))
    running = _phase(env, namespace, "slow", "Running")
    # a change to the running pod must not restart its run
    k8s.CoreV1Api(env.api).patch_namespaced_pod(
        "slow", namespace, {"metadata": {"labels": {"touched": "yes"}}}
    )
    done = _phase(env, namespace, "slow", "Succeeded")
    finished = max(t.finished_at for t in _terminated(done))
    started: datetime.datetime = running.status.start_time
    # startTime has whole seconds: the run lasts between run-seconds - 1 and run-seconds
    assert finished - started >= datetime.timedelta(seconds=3), (started, finished)
    assert finished - started < datetime.timedelta(seconds=30), (started, finished)


def test_exit_code_fails_the_task_after_its_run(
    env: Env, namespace: str, job: dict[str, Any]
) -> None:
    _create(
        env,
        namespace,
        _task("crash", job, **{ANNOTATION_RUN_SECONDS: "2", ANNOTATION_EXIT_CODE: "3"}),
    )
    running = _phase(env, namespace, "crash", "Running")
    failed = _phase(env, namespace, "crash", "Failed")
    terminated = _terminated(failed)
    assert all(t and t.exit_code == 3 and t.reason == "Error" for t in terminated), terminated
    assert min(t.finished_at for t in terminated) - running.status.start_time >= (
        datetime.timedelta(seconds=1)
    )
    _create(env, namespace, _task("clean-exit", job, **{ANNOTATION_EXIT_CODE: "0"}))
    assert _terminated(_phase(env, namespace, "clean-exit", "Succeeded"))[0].exit_code == 0


def test_service_pods_keep_running_and_deleted_tasks_go(
    env: Env, namespace: str, job: dict[str, Any], serviceworkload: dict[str, Any]
) -> None:
    core = k8s.CoreV1Api(env.api)
    _create(env, namespace, _task("service", serviceworkload, **{ANNOTATION_EXIT_CODE: "1"}))
    service = _phase(env, namespace, "service", "Running")
    _create(env, namespace, _task("long", job, **{ANNOTATION_RUN_SECONDS: "600"}))
    _phase(env, namespace, "long", "Running")
    _create(env, namespace, _task("short", job, **{ANNOTATION_RUN_SECONDS: "2"}))
    short = _phase(env, namespace, "short", "Succeeded")
    # the service pod started before the short task and still runs after it ended, its
    # exit-code annotation notwithstanding: only tasks end
    assert service.status.start_time <= short.status.start_time
    assert core.read_namespaced_pod("service", namespace).status.phase == "Running"
    assert core.read_namespaced_pod("long", namespace).status.phase == "Running"
    core.delete_namespaced_pod("long", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("long", namespace)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    wait_until("the deleted running task to be gone", gone, timeout=60)
