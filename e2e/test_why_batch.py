"""`kubectl pilotfish why` for batch against the real control plane, run as a user would:
a gang task says which task it is and how much of its gang exists; `why bw/NAME` says
where the workload stands. The gang's pods are made by hand as in `e2e.test_batch_gang`.
"""

from __future__ import annotations

from kubernetes import client as k8s

from e2e.conftest import Env, wait_until
from e2e.test_batch_gang import create_batch, says, task_pod
from e2e.test_kubectl_plugin import ok, plugin


def test_why_a_gang_task_waits_and_a_workload_stands(env: Env, namespace: str) -> None:
    env.require_local()
    uid = create_batch(env, namespace, "train", gang=3)
    core = k8s.CoreV1Api(env.api)
    for i in range(2):
        core.create_namespaced_pod(namespace, task_pod(f"train-{i}-0", "train", uid))
    wait_until(
        "the gate controller to look at the gang",
        lambda: says(env, namespace, "train-1-0", "gang train: 2/3 pods present"),
    )
    out = ok(plugin(env.kubeconfig, "why", "train-1-0", "-n", namespace))
    lines = out.splitlines()
    assert lines[0].startswith(f"Pod {namespace}/train-1-0 is task ")
    assert lines[0].endswith(f"(attempt 0) of BatchWorkload {namespace}/train."), out
    assert lines[1].startswith(
        "It waits first on its gang: 2 of 3 member pods exist, 2 ready (spec.gang 3 of "
        "BatchWorkload train)"
    ), out
    assert "The gate controller reports SchedulingGated" in out

    out = ok(plugin(env.kubeconfig, "why", "bw/train", "-n", namespace))
    assert out.startswith(f"BatchWorkload {namespace}/train"), out
    # Suspended: the batch operator says so once it has written the status; before, `why`
    # says the status is not written yet. Either way it never invents progress.
    assert "suspended" in out or "its status is not written yet" in out, out

    bad = plugin(env.kubeconfig, "why", "sw/train", "-n", namespace)
    assert bad.returncode == 2 and "cannot explain a sw" in bad.stderr
