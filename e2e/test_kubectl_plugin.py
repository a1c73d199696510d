"""`kubectl pilotfish gates | why` against the real control plane, run as a user would.

The plugin is invoked through its `kubectl-pilotfish` entry point with `--kubeconfig`, as
the admin and as an on-call engineer whose client certificate puts them in group
pilotfish:gate-releasers (the group the chart's gate-ownership policy lets remove gates).

Gated pods here carry the gate contract the mutating webhook would write (gates, label,
record). Their namespace is labelled `pilotfish.io/webhooks=disabled` so the webhooks leave
that hand-written contract alone; the API server's own gate-ownership policy still applies,
which is what the release tests are about.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, wait_until
from pilotfish import gates, names, timeutil
from pilotfish.devcluster import kubeconfig as kcfg

PLUGIN = Path(sys.executable).parent / "kubectl-pilotfish"
DATA = "gates.pilotfish.io/data-ready"
WAREHOUSE = "gates.pilotfish.io/warehouse"
ONCALL = "oncall-alice"
RELEASERS = "pilotfish:gate-releasers"
POLICY = "pilotfish-gate-ownership"


def plugin(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PLUGIN), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def gated_pod(name: str, held: tuple[str, ...], timeout: int = 3600) -> dict[str, Any]:
    """A pod as the mutating webhook leaves it: gates, the gated label and the record."""
    created = now()
    deadline = timeutil.format_time(created + datetime.timedelta(seconds=timeout))
    records = {
        g: gates.GateRecord(
            policy="e2e-policy",
            generation=1,
            condition={"type": "GateSignal", "signalName": g.split("/", 1)[1]},
            timeout_seconds=timeout,
            deadline=deadline,
        )
        for g in held
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {gates.LABEL_GATED: "true", "app": name},
            "annotations": {
                gates.ANNOTATION_CREATED: timeutil.format_time(created),
                gates.ANNOTATION_RECORD: gates.PodGates(
                    timeutil.format_time(created), records
                ).encode(),
            },
        },
        "spec": {
            "schedulingGates": [{"name": g} for g in held],
            "containers": [{"name": "app", "image": "example/app:1"}],
        },
    }


def plain_pod(name: str, cpu: str = "100m") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [
                {"name": "app", "image": "example/app:1", "resources": {"requests": {"cpu": cpu}}}
            ]
        },
    }


def read_pod(env: Env, ns: str, name: str) -> dict[str, Any]:
    resp = k8s.CoreV1Api(env.api).read_namespaced_pod(name, ns, _preload_content=False)
    data: dict[str, Any] = json.loads(resp.data)
    return data


def pod_events(env: Env, ns: str, name: str, reason: str) -> list[Any]:
    items = (
        k8s.CoreV1Api(env.api)
        .list_namespaced_event(ns, field_selector=f"involvedObject.name={name},reason={reason}")
        .items
    )
    return list(items)


@pytest.fixture
def ns(env: Env, namespace: str) -> str:
    """The test's namespace, with the webhooks switched off (see the module docstring), and
    the on-call RBAC a cluster would grant group pilotfish:gate-releasers there."""
    core = k8s.CoreV1Api(env.api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"pilotfish.io/webhooks": "disabled"}}})
    rbac = k8s.RbacAuthorizationV1Api(env.api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "gate-releaser"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "patch", "delete"],
                },
                {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "gate-releaser"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "gate-releaser",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": RELEASERS}
            ],
        },
    )
    # The policy the pods' records name: the gate controller releases nothing its policy
    # does not declare.
    k8s.CustomObjectsApi(env.api).create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        namespace,
        "gatepolicies",
        {
            "apiVersion": names.API_VERSION,
            "kind": "GatePolicy",
            "metadata": {"name": "e2e-policy"},
            "spec": {
                "selector": {},
                "gates": [
                    {
                        "name": g,
                        "condition": {"type": "GateSignal", "signalName": g.split("/", 1)[1]},
                        "timeoutSeconds": 3600,
                    }
                    for g in (DATA, WAREHOUSE)
                ],
            },
        },
    )
    return namespace


@pytest.fixture(scope="module")
def oncall(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A kubeconfig for user oncall-alice in group pilotfish:gate-releasers: a client
    certificate signed by the local cluster's CA, as a real cluster's identity provider
    would vouch for a person and their groups."""
    layout = env.require_local()
    pki = layout.pki
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    start = now() - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, ONCALL),
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, RELEASERS),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    d = tmp_path_factory.mktemp("oncall")
    (d / "oncall.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "oncall.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = yaml.safe_load(env.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    yield kcfg.write(
        d / "kubeconfig",
        server,
        pki.ca_cert,
        ONCALL,
        client_cert=d / "oncall.crt",
        client_key=d / "oncall.key",
    )


def has_gate_policy(env: Env) -> bool:
    try:
        k8s.AdmissionregistrationV1Api(env.api).read_validating_admission_policy(POLICY)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


# --- listing and explaining gated pods ------------------------------------------------------


def patched_by(env: Env, ns: str, pod: str, key: str, username: str) -> bool:
    """The API server's audit log has a successful patch of `pod` whose `key` (`user`, or
    `impersonatedUser` for a request made with --as) is `username`."""
    for line in (env.require_local().logs / "audit.log").read_text().splitlines():
        e = json.loads(line)
        ref = e.get("objectRef") or {}
        if (
            e.get("verb") == "patch"
            and ref.get("namespace") == ns
            and ref.get("name") == pod
            and (e.get(key) or {}).get("username") == username
            and (e.get("responseStatus") or {}).get("code") == 200
        ):
            return True
    return False


def test_gates_lists_a_gated_pod_with_its_deadline(env: Env, ns: str) -> None:
    body = gated_pod("batch-0", (DATA, WAREHOUSE))
    k8s.CoreV1Api(env.api).create_namespaced_pod(ns, body)
    deadline = json.loads(body["metadata"]["annotations"][gates.ANNOTATION_RECORD])[DATA][
        "deadline"
    ]
    out = ok(plugin(env.kubeconfig, "gates", "-n", ns))
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["NAMESPACE", "POD", "GATE", "CONDITION"]
    cells = {r.split()[2]: r.split() for r in rows}
    assert set(cells) == {DATA, WAREHOUSE}, out
    assert cells[DATA][:4] == [ns, "batch-0", DATA, "GateSignal(data-ready)"]
    assert "in 59m" in " ".join(cells[DATA]) or "in 60m" in " ".join(cells[DATA]), out
    assert "Fail" in cells[DATA]

    items = json.loads(ok(plugin(env.kubeconfig, "gates", "-n", ns, "-o", "json")))["items"]
    assert {(i["pod"], i["gate"], i["deadline"], i["expired"]) for i in items} == {
        ("batch-0", DATA, deadline, False),
        ("batch-0", WAREHOUSE, deadline, False),
    }
    everywhere = ok(plugin(env.kubeconfig, "gates", "-A", "-o", "json"))
    assert any(i["namespace"] == ns for i in json.loads(everywhere)["items"])


def test_why_says_gated_and_names_the_gates(env: Env, ns: str) -> None:
    k8s.CoreV1Api(env.api).create_namespaced_pod(ns, gated_pod("batch-1", (DATA,)))
    out = ok(plugin(env.kubeconfig, "why", "batch-1", "-n", ns))
    first = out.splitlines()[0]
    assert first.startswith(f"Pod {ns}/batch-1 is gated"), out
    assert DATA in first and "not a scheduling failure" in first
    assert "signal 'data-ready' is raised" in out and "onExpiry Fail" in out
    # Once the gate controller has looked at the pod, `why` quotes its State condition.
    env.require_local()
    wait_until(
        "the gate controller's State condition",
        lambda: any(
            c.get("type") == gates.POD_CONDITION
            for c in read_pod(env, ns, "batch-1")["status"].get("conditions") or []
        ),
    )
    out = ok(plugin(env.kubeconfig, "why", "batch-1", "-n", ns))
    assert "The gate controller reports SchedulingGated" in out, out


# --- the audited manual path ---------------------------------------------------------------


def test_release_is_refused_for_non_releasers_with_the_servers_message(env: Env, ns: str) -> None:
    if not has_gate_policy(env):
        pytest.skip(f"the chart has no ValidatingAdmissionPolicy {POLICY}")
    k8s.CoreV1Api(env.api).create_namespaced_pod(ns, gated_pod("batch-2", (DATA, WAREHOUSE)))
    for dry in ([], ["--dry-run=server"]):
        res = plugin(
            env.kubeconfig, "gates", "release", "batch-2", DATA, "--reason", "try", "-n", ns, *dry
        )
        assert res.returncode == 1, res.stdout + res.stderr
        assert "the API server refused to release" in res.stderr
        # The policy's own words, naming who was refused and who may do it.
        assert "cannot be removed by pilotfish-admin" in res.stderr, res.stderr
        assert RELEASERS in res.stderr
        assert "you are pilotfish-admin (groups: system:masters" in res.stderr
    after = read_pod(env, ns, "batch-2")
    assert gates.scheduling_gates(after) == [DATA, WAREHOUSE]
    assert "gates.pilotfish.io/manual-release" not in after["metadata"]["annotations"]
    assert pod_events(env, ns, "batch-2", "GateManuallyReleased") == []


def test_release_removes_only_that_gate_and_records_who_and_why(
    env: Env, ns: str, oncall: Path
) -> None:
    k8s.CoreV1Api(env.api).create_namespaced_pod(ns, gated_pod("batch-3", (DATA, WAREHOUSE)))
    dry = ok(
        plugin(oncall, "gates", "release", "batch-3", DATA, "--reason", "r", "-n", ns, "--dry-run")
    )
    assert "(dry run) release gate" in dry
    assert gates.scheduling_gates(read_pod(env, ns, "batch-3")) == [DATA, WAREHOUSE]

    reason = "warehouse export done by hand, INC-1234"
    res = plugin(oncall, "gates", "release", "batch-3", "data-ready", "--reason", reason, "-n", ns)
    out = ok(res)
    assert f"released from {DATA} by {ONCALL}" in out and f"keeps {WAREHOUSE}" in out
    assert "warning" not in res.stderr, res.stderr

    pod = read_pod(env, ns, "batch-3")
    assert gates.scheduling_gates(pod) == [WAREHOUSE]
    note = json.loads(pod["metadata"]["annotations"]["gates.pilotfish.io/manual-release"])
    assert note["gate"] == DATA and note["by"] == ONCALL and note["reason"] == reason
    events = wait_until(
        "the GateManuallyReleased event",
        lambda: pod_events(env, ns, "batch-3", "GateManuallyReleased"),
    )
    assert ONCALL in events[0].message and reason in events[0].message

    # A gate the pod no longer holds is refused, naming the ones it does hold.
    res = plugin(oncall, "gates", "release", "batch-3", DATA, "--reason", reason, "-n", ns)
    assert res.returncode == 1
    assert f"does not hold gate {DATA}; it holds: {WAREHOUSE}" in res.stderr

    # The API server's audit log names who removed the gate.
    wait_until(
        "the audit log entry of the release", lambda: patched_by(env, ns, "batch-3", "user", ONCALL)
    )


def test_cancel_deletes_the_gated_pod_with_an_event(env: Env, ns: str) -> None:
    k8s.CoreV1Api(env.api).create_namespaced_pod(ns, gated_pod("batch-4", (DATA,)))
    ok(plugin(env.kubeconfig, "gates", "cancel", "batch-4", "--reason", "r", "-n", ns, "--dry-run"))
    assert read_pod(env, ns, "batch-4")["metadata"]["name"] == "batch-4"

    out = ok(
        plugin(env.kubeconfig, "gates", "cancel", "batch-4", "--reason", "duplicate", "-n", ns)
    )
    assert "cancelled" in out

    def gone() -> bool:
        try:
            read_pod(env, ns, "batch-4")
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    wait_until("the cancelled pod to be gone", gone)
    events = pod_events(env, ns, "batch-4", "GateCancelled")
    assert events and "duplicate" in events[0].message


def test_cancel_refuses_a_pod_pilotfish_does_not_gate(env: Env, ns: str) -> None:
    k8s.CoreV1Api(env.api).create_namespaced_pod(ns, plain_pod("free"))
    res = plugin(env.kubeconfig, "gates", "cancel", "free", "--reason", "r", "-n", ns)
    assert res.returncode == 1 and "holds no Pilotfish gates" in res.stderr
    assert read_pod(env, ns, "free")["metadata"].get("deletionTimestamp") is None


# --- why: unschedulable and running -------------------------------------------------------


def test_why_quotes_the_schedulers_reason_for_an_unschedulable_pod(env: Env, ns: str) -> None:
    k8s.CoreV1Api(env.api).create_namespaced_pod(ns, plain_pod("huge", cpu="1000"))
    wait_until(
        "PodScheduled=False",
        lambda: any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in read_pod(env, ns, "huge")["status"].get("conditions") or []
        ),
    )
    message = next(
        c["message"]
        for c in read_pod(env, ns, "huge")["status"]["conditions"]
        if c["type"] == "PodScheduled"
    )
    assert "Insufficient cpu" in message
    out = ok(plugin(env.kubeconfig, "why", "huge", "-n", ns))
    assert out.splitlines()[0].startswith(f"Pod {ns}/huge is unschedulable"), out
    assert message in out
    assert "Latest FailedScheduling event" in out
    assert "gated" not in out


def test_why_says_a_running_pod_runs(env: Env, ns: str) -> None:
    k8s.CoreV1Api(env.api).create_namespaced_pod(ns, plain_pod("web"))
    wait_until(
        "the pod Running and Ready",
        lambda: any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in read_pod(env, ns, "web")["status"].get("conditions") or []
        ),
    )
    node = read_pod(env, ns, "web")["spec"]["nodeName"]
    out = ok(plugin(env.kubeconfig, "why", "web", "-n", ns))
    assert out.splitlines()[0].startswith(f"Pod {ns}/web is running on node {node} and ready")


# --- acting as another identity with kubectl's --as / --as-group ---------------------------


def test_release_as_another_identity_is_judged_as_that_identity(
    env: Env, ns: str, tenant: Tenant
) -> None:
    """The admin's kubeconfig with `--as`: the API server decides as the impersonated user,
    and the plugin says who that was; with the releasers' group the release goes through and
    is recorded under the impersonated name."""
    if not has_gate_policy(env):
        pytest.skip(f"the chart has no ValidatingAdmissionPolicy {POLICY}")
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_pod(ns, gated_pod("batch-as", (DATA, WAREHOUSE)))
    release = ("gates", "release", "batch-as", DATA, "--reason", "INC-7")

    # A user with no rights at all cannot even read the pod: refused by RBAC, by name.
    nobody = f"nobody-{ns}"[:60]
    res = plugin(env.kubeconfig, *release, "-n", ns, "--as", nobody)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f'User "{nobody}" cannot get resource "pods"' in res.stderr, res.stderr

    # The namespace's tenant (edit there) may patch pods, but not remove Pilotfish gates:
    # the gate-ownership policy's 403, naming the tenant, not the admin who ran the plugin.
    res = plugin(env.kubeconfig, "--as", tenant.user, *release, "-n", ns)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "the API server refused to release" in res.stderr, res.stderr
    assert "(403 Forbidden)" in res.stderr
    assert f"cannot be removed by {tenant.user}" in res.stderr
    assert f"you are {tenant.user} (groups: system:authenticated)" in res.stderr
    assert "pilotfish-admin" not in res.stderr
    assert gates.scheduling_gates(read_pod(env, ns, "batch-as")) == [DATA, WAREHOUSE]

    # An on-call identity in the releasers' group (flags after the subcommand this time).
    oncall = "oncall-bob"
    out = ok(plugin(env.kubeconfig, *release, "-n", ns, "--as", oncall, "--as-group", RELEASERS))
    assert f"released from {DATA} by {oncall}" in out, out
    pod = read_pod(env, ns, "batch-as")
    assert gates.scheduling_gates(pod) == [WAREHOUSE]
    note = json.loads(pod["metadata"]["annotations"]["gates.pilotfish.io/manual-release"])
    assert note["by"] == oncall
    events = wait_until(
        "the GateManuallyReleased event",
        lambda: pod_events(env, ns, "batch-as", "GateManuallyReleased"),
    )
    assert oncall in events[0].message

    # The API server's audit log has the admin acting as oncall-bob.
    wait_until(
        "the audit log entry of the impersonated release",
        lambda: patched_by(env, ns, "batch-as", "impersonatedUser", oncall),
    )


def test_gates_list_as_a_user_without_rights_is_refused_naming_them(env: Env, ns: str) -> None:
    res = plugin(env.kubeconfig, "gates", "-n", ns, "--as", "nobody-lister")
    assert res.returncode == 1, res.stdout + res.stderr
    assert 'User "nobody-lister" cannot list resource "pods"' in res.stderr, res.stderr
