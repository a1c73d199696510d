"""API server outages are ridden out unattended, and a crashed part is brought back.

The outage is a frozen kube-apiserver (SIGSTOP, then SIGCONT): every request and watch hangs,
neither failing nor answering, as behind a partition that drops packets. It is the harsher
case for clients (only their own deadlines get them out of a hung call), and it leaves
upstream's own clients (kube-scheduler, kwok) able to reconnect the moment the server thaws,
whereas after a refused connection client-go's reflectors back off for up to a minute; what
is measured here is Pilotfish, not that backoff.

- A short outage (a few seconds, less than the lease's renew deadline) costs nothing: the
  operator keeps its lease and its process.
- A minute-long outage loses the operator its lease; it exits, its supervisor restarts it,
  and within 10 s of the API server's return (/readyz ok) every part acts again: a scale
  change creates pods (operator), a gated pod whose GateSignal turns Ready is released
  (operator), a new tenant pod is admitted (webhooks) and bound through the extender, and the
  operator holds the lease again.

Self-contained and safe to run last: the API server is thawed (or restarted the way
`pilotfish dev up` starts it, should it have died) in a `finally`, and each test waits until
every component of the cluster is healthy again before it ends.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import NO_NODE, Env, Tenant, wait_until
from pilotfish import names
from pilotfish.devcluster import cluster, components, supervisor
from pilotfish.devcluster.components import Component
from pilotfish.devcluster.supervisor import Running
from pilotfish.workloads import LABEL_WORKLOAD

pytestmark = [pytest.mark.e2e, pytest.mark.disruptive]

OPERATOR = "pilotfish-operator"
LEASE = "pilotfish-operator"
GATE = "gates.pilotfish.io/outage-over"
SIGNAL = "outage-over"
SHORT_OUTAGE = 4.0  # well inside the renew deadline (10 s)
LONG_OUTAGE = 60.0  # far beyond the lease (15 s)
RECOVERY = 10.0  # every part acts again within this of the API server's return


# --- the cluster's processes -------------------------------------------------------------------


def apiserver(env: Env) -> Component:
    layout = env.require_local()
    assert env.spec is not None
    comps = components.control_plane(layout, env.spec.ports, env.bins)
    return next(c for c in comps if c.name == "kube-apiserver")


def child(env: Env, name: str) -> Running:
    layout = env.require_local()
    return wait_until(f"{name} running", lambda: supervisor.child(layout, name), timeout=30)


def replaced(env: Env, name: str, old: Running) -> Running | None:
    """The unit's child if it is a new process, not `old`."""
    current = supervisor.child(env.require_local(), name)
    return current if current is not None and current != old else None


def log_since(env: Env, name: str, offset: int) -> str:
    with env.require_local().log(name).open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def log_size(env: Env, name: str) -> int:
    return env.require_local().log(name).stat().st_size


def all_healthy(env: Env) -> bool:
    return bool(cluster.status(env.require_local().root)["up"])


@contextlib.contextmanager
def api_outage(env: Env) -> Iterator[None]:
    """The API server frozen for the block; thawed (or restarted) whatever happens."""
    layout = env.require_local()
    proc = supervisor.running(layout, "kube-apiserver")
    assert proc is not None, "kube-apiserver is not running"
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
        if supervisor.running(layout, "kube-apiserver") is None:
            supervisor.start(layout, apiserver(env), ready_timeout=120)


def throughout(seconds: float, what: str, check: Callable[[], bool]) -> None:
    """`check` holds at every look for `seconds`: the outage's own length, not a wait."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert check(), what
        time.sleep(0.25)


def api_back(env: Env) -> float:
    """Wait for /readyz; the monotonic time it first answered ok."""
    health = apiserver(env).health
    wait_until("kube-apiserver /readyz ok", lambda: supervisor.healthy(health), timeout=60)
    return time.monotonic()


def until(deadline: float) -> float:
    """Seconds left before `deadline` (monotonic), for a wait that must end by then."""
    return max(0.5, deadline - time.monotonic())


# --- the lease ---------------------------------------------------------------------------------


def lease(env: Env) -> k8s.V1LeaseSpec:
    spec: k8s.V1LeaseSpec = (
        k8s.CoordinationV1Api(env.api).read_namespaced_lease(LEASE, names.SYSTEM_NAMESPACE).spec
    )
    return spec


def renewed_after(env: Env, holder: str, t: datetime.datetime) -> bool:
    spec = lease(env)
    return spec.holder_identity == holder and spec.renew_time is not None and spec.renew_time > t


def leading_holder(env: Env) -> str:
    """The operator leads (its lease renewed within a few seconds): its identity."""
    start = datetime.datetime.now(datetime.UTC)
    spec = wait_until(
        "the operator renewing its lease",
        lambda: (s := lease(env)).renew_time and s.renew_time > start and s,
        timeout=60,
    )
    return str(spec.holder_identity)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@pytest.fixture
def healthy_after(env: Env) -> Iterator[None]:
    """Leave the cluster as later tests need it: every component healthy."""
    env.require_local()
    yield
    wait_until("every component healthy again", lambda: all_healthy(env), timeout=180)


# --- a crash, and a short outage ---------------------------------------------------------------


def test_a_crashed_operator_is_restarted_by_its_supervisor(env: Env, healthy_after: None) -> None:
    holder = leading_holder(env)
    before = child(env, OPERATOR)
    offset = log_size(env, OPERATOR)
    crashed_at = now()
    os.kill(before.pid, signal.SIGKILL)  # the child only: the supervisor must notice
    after = wait_until(
        "a new operator process",
        lambda: replaced(env, OPERATOR, before),
        timeout=RECOVERY,
    )
    component = env.host_process(OPERATOR)
    wait_until("the new operator healthy", lambda: supervisor.healthy(component.health), 30)
    assert "pilotfish-operator exited (signal SIGKILL)" in log_since(env, OPERATOR, offset)
    # Same identity: it waits out the crashed run's lease (writes may still be in flight),
    # then leads again; nobody had to run `pilotfish dev up`.
    wait_until("the lease renewed again", lambda: renewed_after(env, holder, crashed_at), 45)
    assert supervisor.child(env.require_local(), OPERATOR) == after


def test_a_short_outage_costs_nothing(env: Env, healthy_after: None) -> None:
    holder = leading_holder(env)
    operator = child(env, OPERATOR)
    offset = log_size(env, OPERATOR)
    layout = env.require_local()
    with api_outage(env):
        throughout(
            SHORT_OUTAGE,
            "the operator kept running through the outage",
            lambda: supervisor.child(layout, OPERATOR) == operator,
        )
    back = api_back(env)
    thawed = now()
    wait_until(
        "the same operator renewing its lease",
        lambda: renewed_after(env, holder, thawed),
        timeout=until(back + RECOVERY),
    )
    assert supervisor.child(layout, OPERATOR) == operator, "the operator was restarted"
    text = log_since(env, OPERATOR, offset)
    assert "lost leadership" not in text and "exited (" not in text, text


# --- a minute-long outage ----------------------------------------------------------------------


def custom(env: Env) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(env.api)


def tenant_pod(name: str, labels: dict[str, str], node_selector: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "c",
                "image": "example/app:1",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        spec["nodeSelector"] = NO_NODE
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def set_signal(env: Env, namespace: str, ready: bool) -> None:
    status = "True" if ready else "False"
    condition = {
        "type": "Ready",
        "status": status,
        "reason": "OutageOver" if ready else "OutageGoingOn",
        "message": "set by the e2e test",
        "lastTransitionTime": now().strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    custom(env).patch_namespaced_custom_object_status(
        names.GROUP,
        names.VERSION,
        namespace,
        "gatesignals",
        SIGNAL,
        {"status": {"conditions": [condition]}},
    )


def gates_of(env: Env, namespace: str, name: str) -> list[str]:
    pod = k8s.CoreV1Api(env.api).read_namespaced_pod(name, namespace)
    return [g.name for g in pod.spec.scheduling_gates or []]


def workload_pods(env: Env, namespace: str, name: str) -> int:
    pods = k8s.CoreV1Api(env.api).list_namespaced_pod(
        namespace, label_selector=f"{LABEL_WORKLOAD}={name}"
    )
    return sum(p.metadata.deletion_timestamp is None for p in pods.items)


def extender_filter_calls(env: Env) -> float:
    text = supervisor.fetch(env.host_process("pilotfish-extender").health, "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("pilotfish_extender_requests_total{") and all(
            f'{k}="{v}"' in line for k, v in (("verb", "filter"), ("outcome", "ok"))
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def prepare(env: Env, tenant: Tenant) -> None:
    """Before the outage: a running ServiceWorkload of 1, and a pod held by a gate whose
    GateSignal is not Ready yet."""
    ns = tenant.namespace
    custom(env).create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        ns,
        "serviceworkloads",
        {
            "apiVersion": names.API_VERSION,
            "kind": "ServiceWorkload",
            "metadata": {"name": "web"},
            "spec": {
                "team": "e2e",
                "replicas": 1,
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": tenant_pod("x", {})["spec"],
                },
            },
        },
    )
    wait_until("the workload's first pod", lambda: workload_pods(env, ns, "web") == 1, 60)
    custom(env).create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        ns,
        "gatesignals",
        {"apiVersion": names.API_VERSION, "kind": "GateSignal", "metadata": {"name": SIGNAL}},
    )
    set_signal(env, ns, ready=False)
    custom(env).create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        ns,
        "gatepolicies",
        {
            "apiVersion": names.API_VERSION,
            "kind": "GatePolicy",
            "metadata": {"name": "held"},
            "spec": {
                "selector": {"matchLabels": {"app": "held"}},
                "gates": [
                    {
                        "name": GATE,
                        "condition": {"type": "GateSignal", "signalName": SIGNAL},
                        "timeoutSeconds": 3600,
                    }
                ],
            },
        },
    )
    held = tenant_pod("held", {"app": "held"}, node_selector=True)

    def gated_at_admission() -> bool:
        try:
            k8s.CoreV1Api(tenant.api).create_namespaced_pod(ns, held)
        except ApiException as e:
            if e.status in (400, 403, 500, 503):  # the webhooks have not seen the policy yet
                return False
            raise
        if GATE in gates_of(env, ns, "held"):
            return True
        k8s.CoreV1Api(env.api).delete_namespaced_pod("held", ns, grace_period_seconds=0)
        wait_until("the ungated try gone", lambda: not _exists(env, ns, "held"), 30)
        return False

    wait_until("a pod gated at admission", gated_at_admission, timeout=60)


def _exists(env: Env, namespace: str, name: str) -> bool:
    try:
        k8s.CoreV1Api(env.api).read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def test_a_minute_long_outage_is_ridden_out_unattended(
    env: Env, tenant: Tenant, healthy_after: None
) -> None:
    layout = env.require_local()
    ns = tenant.namespace
    prepare(env, tenant)
    holder = leading_holder(env)
    operator = child(env, OPERATOR)
    servers = {n: child(env, n) for n in ("pilotfish-extender", "pilotfish-webhooks")}
    offset = log_size(env, OPERATOR)
    filter_calls = extender_filter_calls(env)

    with api_outage(env):
        frozen = time.monotonic()
        # Cut off for longer than its renew deadline, the operator steps down and exits
        # rather than act on a lease it may have lost; its supervisor starts it again.
        restarted = wait_until(
            "the operator restarted after losing its lease",
            lambda: replaced(env, OPERATOR, operator),
            timeout=30,
        )
        throughout(
            LONG_OUTAGE - (time.monotonic() - frozen),
            "the restarted operator waits for the API server instead of exiting again",
            lambda: supervisor.child(layout, OPERATOR) == restarted,
        )
    back = api_back(env)
    returned = now()
    deadline = back + RECOVERY
    text = log_since(env, OPERATOR, offset)
    assert "lost leadership" in text and "pilotfish-operator exited (exit code 3)" in text, text

    core = k8s.CoreV1Api(env.api)
    custom(env).patch_namespaced_custom_object_scale(
        names.GROUP, names.VERSION, ns, "serviceworkloads", "web", {"spec": {"replicas": 3}}
    )
    set_signal(env, ns, ready=True)

    def admitted() -> bool:
        try:
            k8s.CoreV1Api(tenant.api).create_namespaced_pod(ns, tenant_pod("after", {}))
        except ApiException as e:
            if e.status in (500, 503, 504):  # the webhooks not answering (yet)
                return False
            raise
        return True

    wait_until("a new tenant pod admitted", admitted, timeout=until(deadline))
    wait_until(
        "the new tenant pod bound",
        lambda: core.read_namespaced_pod("after", ns).spec.node_name,
        timeout=until(deadline),
    )
    wait_until(
        "the scale change acted on", lambda: workload_pods(env, ns, "web") == 3, until(deadline)
    )
    wait_until("the gated pod released", lambda: not gates_of(env, ns, "held"), until(deadline))
    wait_until(
        "the operator holding its lease again",
        lambda: renewed_after(env, holder, returned),
        timeout=until(deadline),
    )
    assert extender_filter_calls(env) > filter_calls, "the pod was placed without the extender"
    assert supervisor.child(layout, OPERATOR) == restarted
    # The servers rode the outage out in place: no restart was needed.
    assert {n: supervisor.child(layout, n) for n in servers} == servers
