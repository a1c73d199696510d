"""`make demo`: the local control plane, Pilotfish installed by its chart, an example of each kind.

Then short scenarios, each showing one capability on the real control plane, and what a
person needs to look around afterwards: a status table, the KUBECONFIG line, how to stop.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from pilotfish import names, timeutil
from pilotfish.devcluster import binaries, cluster
from pilotfish.devcluster.components import Layout

NAMESPACE = "team-payments"
SIGNAL = "warehouse-export"


def examples_dir() -> Path:
    root = binaries.checkout_root()
    if root is None:
        raise RuntimeError("the demo applies examples/ from a source checkout")
    return root / "examples"


def kubectl(layout: Layout, *args: str) -> str:
    bins = binaries.bin_dir()
    cmd = [str(bins / "kubectl"), "--kubeconfig", str(layout.admin_kubeconfig), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def show(text: str) -> None:
    print("    " + text.rstrip().replace("\n", "\n    "))


def show_pods(layout: Layout, selector: str, columns: str) -> None:
    """The demo namespace's pods matching `selector`, as kubectl custom columns."""
    show(
        kubectl(
            layout,
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            selector,
            "-o",
            f"custom-columns={columns}",
        )
    )


def wait(what: str, check: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise RuntimeError(f"demo: timed out waiting for {what}")


def ledger_pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"ledger-{i}", "labels": {"app": "ledger", names.LABEL_BAND: "batch"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "task",
                    "image": "registry.example/payments/ledger:2.3",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
        },
    }


def gated_release(layout: Layout) -> None:
    """A gated batch: pods created now, held from the scheduler, released by a signal."""
    api = cluster.api_client(layout)
    core = k8s.CoreV1Api(api)
    custom = k8s.CustomObjectsApi(api)
    print("==> gated release: 5 ledger pods wait for the warehouse export signal")

    def policy_seen() -> bool:  # admission reads GatePolicies from a watch: let it catch up
        probe = core.create_namespaced_pod(NAMESPACE, ledger_pod(0), dry_run="All")
        return bool(probe.spec.scheduling_gates)

    wait("GatePolicy ledger-inputs visible to admission", policy_seen)
    for i in range(5):
        core.create_namespaced_pod(NAMESPACE, ledger_pod(i))
    show_pods(
        layout,
        "app=ledger",
        "POD:.metadata.name,GATES:.spec.schedulingGates[*].name,NODE:.spec.nodeName",
    )
    now = timeutil.format_time(timeutil.SYSTEM_CLOCK.now())
    print(f"==> the export finishes: GateSignal {SIGNAL} turns Ready")
    custom.patch_namespaced_custom_object_status(
        names.GROUP,
        names.VERSION,
        NAMESPACE,
        "gatesignals",
        SIGNAL,
        {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "ExportDone",
                        "message": "export complete",
                        "lastTransitionTime": now,
                    }
                ]
            }
        },
    )

    def released() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector="app=ledger").items
        return len(pods) == 5 and all(
            not p.spec.scheduling_gates and p.status.phase in ("Running", "Succeeded") for p in pods
        )

    wait("the ledger pods released and running", released)
    show_pods(
        layout,
        "app=ledger",
        "POD:.metadata.name,PHASE:.status.phase,"
        "NODE:.spec.nodeName,PRIORITY:.spec.priorityClassName",
    )


def _sw_status(custom: Any) -> dict[str, Any]:
    sw = custom.get_namespaced_custom_object(
        names.GROUP, names.VERSION, NAMESPACE, "serviceworkloads", "checkout"
    )
    return dict(sw.get("status") or {})


def _slice_summary(layout: Layout) -> str:
    return kubectl(
        layout,
        "get",
        "endpointslices",
        "-n",
        NAMESPACE,
        "-l",
        "kubernetes.io/service-name=checkout",
        "-o",
        "custom-columns=SLICE:.metadata.name,MANAGED-BY:.metadata.labels."
        "endpointslice\\.kubernetes\\.io/managed-by,READY:.endpoints[*].conditions.ready",
    )


def service_rollout(layout: Layout) -> None:
    """The checkout service rolls to a new version; its endpoints follow, none dropped."""
    api = cluster.api_client(layout)
    custom = k8s.CustomObjectsApi(api)
    wait(
        "checkout Available with 6 replicas",
        lambda: _sw_status(custom).get("availableReplicas") == 6,
    )
    print("==> service: checkout has 6 replicas behind a fixed ClusterIP and its EndpointSlices")
    show(kubectl(layout, "get", "service", "checkout", "-n", NAMESPACE))
    show(_slice_summary(layout))
    before = _sw_status(custom).get("currentRevision")
    print("==> rolling checkout to 1.1 (maxSurge 1, maxUnavailable 0)")
    custom.patch_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        NAMESPACE,
        "serviceworkloads",
        "checkout",
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "app",
                                "image": "registry.example/payments/checkout:1.1",
                                "ports": [{"containerPort": 8080}],
                                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
                            }
                        ]
                    }
                }
            }
        },
    )

    def rolled() -> bool:
        st = _sw_status(custom)
        return (
            st.get("currentRevision") not in (None, before)
            and st.get("updatedReplicas") == 6
            and st.get("availableReplicas") == 6
            and st.get("replicas") == 6
        )

    wait("checkout rolled out", rolled, timeout=180)
    show(kubectl(layout, "get", "sw", "checkout", "-n", NAMESPACE))
    show(_slice_summary(layout))


def production_during_burst(layout: Layout) -> None:
    """Production is placed within seconds while a batch burst queues behind it."""
    core = k8s.CoreV1Api(cluster.api_client(layout))
    burst = 150
    print(f"==> a burst of {burst} batch pods, then 3 production pods")
    for i in range(burst):
        body = ledger_pod(100 + i)
        body["metadata"]["labels"] = {"app": "burst", names.LABEL_BAND: "batch"}
        body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "200m"
        core.create_namespaced_pod(NAMESPACE, body)
    started = time.monotonic()
    for i in range(3):
        core.create_namespaced_pod(
            NAMESPACE,
            {
                "metadata": {
                    "name": f"checkout-hotfix-{i}",
                    "labels": {"app": "hotfix", names.LABEL_BAND: "production"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.example/payments/hotfix:1",
                            "resources": {"requests": {"cpu": "250m"}},
                        }
                    ]
                },
            },
        )

    def production_bound() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector="app=hotfix").items
        return len(pods) == 3 and all(p.spec.node_name for p in pods)

    wait("production pods bound", production_bound)
    took = time.monotonic() - started
    pending = sum(
        1
        for p in core.list_namespaced_pod(NAMESPACE, label_selector="app=burst").items
        if not p.spec.node_name
    )
    print(
        f"    3 production pods bound {took:.1f}s after creation, "
        f"while {pending} of {burst} batch pods were still waiting for the scheduler"
    )
    show_pods(
        layout, "app=hotfix", "POD:.metadata.name,NODE:.spec.nodeName,PRIORITY:.spec.priority"
    )


def _bw_status(custom: Any) -> dict[str, Any]:
    bw = custom.get_namespaced_custom_object(
        names.GROUP, names.VERSION, NAMESPACE, "batchworkloads", "reconcile"
    )
    return dict(bw.get("status") or {})


def _complete(status: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Complete" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def batch_while_scaling(layout: Layout) -> None:
    """A batch job runs to completion while production scales: both get what they asked for."""
    custom = k8s.CustomObjectsApi(cluster.api_client(layout))
    print("==> a 60-task BatchWorkload runs while checkout scales from 6 to 9 replicas")
    show(kubectl(layout, "apply", "-f", str(examples_dir() / "batch")))
    wait("the job's first tasks", lambda: _bw_status(custom).get("active", 0) > 0)
    custom.patch_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        NAMESPACE,
        "serviceworkloads",
        "checkout",
        {"spec": {"replicas": 9}},
    )
    wait(
        "checkout Available with 9 replicas",
        lambda: _sw_status(custom).get("availableReplicas") == 9,
        timeout=180,
    )
    show(kubectl(layout, "get", "sw", "checkout", "-n", NAMESPACE))
    show(kubectl(layout, "get", "bw", "reconcile", "-n", NAMESPACE))
    wait("the job Complete", lambda: _complete(_bw_status(custom)), timeout=300)
    show(kubectl(layout, "get", "bw", "reconcile", "-n", NAMESPACE, "-o", "wide"))
    st = _bw_status(custom)
    print(
        f"    completed indexes {st.get('completedIndexes')}, "
        f"{st.get('failed', 0)} failed, {st.get('disrupted', 0)} disrupted"
    )


def run(state: Path, nodes: int = cluster.DEFAULT_NODES) -> int:
    print(f"==> starting the local control plane and Pilotfish ({state})")
    layout = cluster.up(state, cluster.ClusterSpec(nodes=nodes))
    print("==> components")
    st = cluster.status(state)
    for name, c in st["components"].items():
        print(f"    {name:<26} pid {c['pid']!s:<8} {'healthy' if c['healthy'] else 'NOT HEALTHY'}")
    print(f"    ready kwok nodes: {st.get('readyNodes')}")
    show(kubectl(layout, "get", "nodes", "-L", "topology.kubernetes.io/zone", "--no-headers"))
    print("==> applying examples/ (a team, its quota, a service, a gate policy and its signal)")
    show(kubectl(layout, "apply", "-f", str(examples_dir())))
    if not _has_pods(layout, "app=ledger"):
        gated_release(layout)
        service_rollout(layout)
        production_during_burst(layout)
        batch_while_scaling(layout)
    print("==> kubectl get pilotfish -A")
    show(kubectl(layout, "get", "pilotfish", "-A"))
    print("\nUse it (the export line puts the pinned kubectl and kubectl-pilotfish first on PATH):")
    for line in cluster.env_lines(state):
        print(f"    {line}")
    print("    kubectl get pilotfish -A")
    print("    kubectl pilotfish gates -A")
    print(f"    kubectl pilotfish why ledger-0 -n {NAMESPACE}")
    print(f"    kubectl pilotfish why bw/reconcile -n {NAMESPACE}")
    print("Stop it:\n    make down")
    print(f"    (or, after the export line: pilotfish dev down --state {state})")
    return 0


def _has_pods(layout: Layout, selector: str) -> bool:
    """The demo's scenarios ran already on this cluster (a second `make demo`)."""
    core = k8s.CoreV1Api(cluster.api_client(layout))
    return bool(core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)
