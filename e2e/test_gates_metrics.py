"""No silent stall: kube-scheduler's own gated queue and Pilotfish's gauge tell the same story."""

from __future__ import annotations

import ssl
import urllib.request

from kubernetes import client as k8s

from e2e.conftest import Env, wait_until
from e2e.test_gates_admission import GATE, create, gate_policy, pod_body, wait_policy_seen
from pilotfish import names, timeutil

PODS = 6


def scrape(url: str, env: Env) -> str:
    ctx: ssl.SSLContext | None = None
    if url.startswith("https://"):
        layout = env.require_local()
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # kube-scheduler's self-signed loopback serving cert
        ctx.load_cert_chain(str(layout.pki.cert("admin")), str(layout.pki.key("admin")))
    with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
        return str(resp.read().decode())


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def api_gated_pods(env: Env) -> int:
    pods = k8s.CoreV1Api(env.api).list_pod_for_all_namespaces().items
    return sum(1 for p in pods if p.spec.scheduling_gates and not p.metadata.deletion_timestamp)


def test_scheduler_gated_queue_agrees_with_pilotfish_gauge(env: Env, namespace: str) -> None:
    env.require_local()
    assert env.spec is not None
    scheduler = f"https://127.0.0.1:{env.spec.ports.scheduler}/metrics"
    operator = f"http://127.0.0.1:{env.spec.ports.operator_metrics}/metrics"
    create(
        env,
        namespace,
        "gatepolicies",
        gate_policy("data", [GATE], {"matchLabels": {"app": "gated"}}),
    )
    wait_policy_seen(env, namespace, pod_body("probe", {"app": "gated"}), GATE)
    core = k8s.CoreV1Api(env.api)
    for i in range(PODS):
        core.create_namespaced_pod(namespace, pod_body(f"g{i}", {"app": "gated"}))

    def agree() -> tuple[float, float] | None:
        sched = sample(scrape(scheduler, env), "scheduler_pending_pods", queue="gated")
        ours = sample(
            scrape(operator, env), "pilotfish_gates_gated_pods", gate=GATE, namespace=namespace
        )
        # The scheduler counts every gated pod of the cluster; the API says how many exist.
        return (sched, ours) if sched == api_gated_pods(env) and ours == PODS else None

    sched, ours = wait_until("both gauges to count the gated pods", agree, timeout=60)
    assert sched >= ours == PODS

    now = timeutil.format_time(timeutil.SYSTEM_CLOCK.now())
    k8s.CustomObjectsApi(env.api).create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        namespace,
        "gatesignals",
        {
            "apiVersion": names.API_VERSION,
            "kind": "GateSignal",
            "metadata": {"name": "data-ready"},
            "spec": {},
        },
    )
    k8s.CustomObjectsApi(env.api).patch_namespaced_custom_object_status(
        names.GROUP,
        names.VERSION,
        namespace,
        "gatesignals",
        "data-ready",
        {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Done",
                        "message": "",
                        "lastTransitionTime": now,
                    }
                ]
            }
        },
    )

    def drained() -> bool:
        sched_now = sample(scrape(scheduler, env), "scheduler_pending_pods", queue="gated")
        ours_now = sample(
            scrape(operator, env), "pilotfish_gates_gated_pods", gate=GATE, namespace=namespace
        )
        return ours_now == 0 and sched_now == api_gated_pods(env)

    wait_until("both gauges to drop once the signal released the pods", drained, timeout=60)
