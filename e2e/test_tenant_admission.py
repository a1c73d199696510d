"""The tenant-isolation matrix at admission: each attempt a tenant with only the built-in
`edit` role in its namespace could make to pick its own team, band, priority, node or
scheduler, tried as that tenant against the real API server and webhooks.

Each attempt is refused with a message naming the field, or neutralised: the other team's
TeamQuota is never charged, and a relabelled pod stays charged to the band it was admitted
in. The team of a namespace is its `pilotfish.io/team` label, which only the platform sets.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, wait_until
from pilotfish import names
from pilotfish.devcluster import nodes

pytestmark = pytest.mark.e2e

CUSTOM = (names.GROUP, names.VERSION, "teamquotas")


def pod(
    name: str,
    band: str | None = None,
    cpu: str = "1",
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    all_labels = dict(labels or {})
    if band is not None:
        all_labels[names.LABEL_BAND] = band
    return {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "example/x:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def denial(exc: ApiException) -> str:
    return str(json.loads(exc.body)["message"])


@dataclass(frozen=True)
class Teams:
    """The tenant's team (its namespace's) and another team, each with its own TeamQuota."""

    env: Env
    tenant: Tenant
    mine: str
    other: str

    @property
    def ns(self) -> str:
        return self.tenant.namespace

    @property
    def pods(self) -> k8s.CoreV1Api:
        """The Pod API as the tenant."""
        return k8s.CoreV1Api(self.tenant.api)

    def refused(self, body: dict[str, Any]) -> str:
        with pytest.raises(ApiException) as err:
            self.pods.create_namespaced_pod(self.ns, body)
        assert err.value.status == 403, err.value.body
        return denial(err.value)

    def status(self, team: str) -> dict[str, Any]:
        tq = k8s.CustomObjectsApi(self.env.api).get_cluster_custom_object(*CUSTOM, team)
        return dict(tq.get("status") or {})

    def used(self, team: str, band: str) -> dict[str, Any]:
        return dict((self.status(team).get("used") or {}).get(band) or {})


def make_quota(env: Env, team: str, bands: dict[str, dict[str, Any]]) -> None:
    k8s.CustomObjectsApi(env.api).create_cluster_custom_object(
        *CUSTOM,
        {
            "apiVersion": names.API_VERSION,
            "kind": "TeamQuota",
            "metadata": {"name": team},
            "spec": {"team": team, "bands": bands},
        },
    )


@pytest.fixture
def teams(env: Env, tenant: Tenant) -> Iterator[Teams]:
    mine, other = f"t{uuid.uuid4().hex[:8]}", f"t{uuid.uuid4().hex[:8]}"
    core = k8s.CoreV1Api(env.api)
    core.patch_namespace(tenant.namespace, {"metadata": {"labels": {names.LABEL_TEAM: mine}}})
    make_quota(env, mine, {"production": {"cpu": "1"}, "batch": {"cpu": "2"}})
    make_quota(env, other, {"production": {"cpu": "100"}, "batch": {"cpu": "100"}})

    def sees_my_quota() -> bool:
        """A dry run charged to my team's 1-CPU production quota is refused for its size."""
        try:
            core.create_namespaced_pod(
                tenant.namespace, pod("probe", "production", "2"), dry_run="All"
            )
        except ApiException as e:
            return f"team {mine}, production cpu" in denial(e)
        return False

    wait_until(f"admission to charge namespace {tenant.namespace} to {mine}", sees_my_quota)
    try:
        yield Teams(env, tenant, mine, other)
    finally:
        for team in (mine, other):
            try:
                k8s.CustomObjectsApi(env.api).delete_cluster_custom_object(*CUSTOM, team)
            except ApiException as e:
                if e.status != 404:
                    raise


def untouched(t: Teams) -> None:
    """The other team's TeamQuota, once the quota operator has written it, holds nothing."""
    status = wait_until(
        f"the quota operator to write TeamQuota {t.other}'s status",
        lambda: (s := t.status(t.other)).get("observedGeneration") and s,
        timeout=60,
    )
    assert not any((status.get("used") or {}).values()), status
    assert not status.get("reservations"), status


# --- the team is the namespace's ---------------------------------------------------------------


def test_a_tenant_cannot_relabel_its_namespace(teams: Teams) -> None:
    label = f"{names.LABEL_TEAM}={teams.other}"
    res = teams.tenant.kubectl("label", "namespace", teams.ns, label, "--overwrite", check=False)
    assert res.returncode != 0 and "forbidden" in res.stderr, res.stderr
    with pytest.raises(ApiException) as err:
        k8s.CoreV1Api(teams.tenant.api).patch_namespace(
            teams.ns, {"metadata": {"labels": {names.LABEL_TEAM: teams.other}}}
        )
    assert err.value.status == 403
    labels = k8s.CoreV1Api(teams.env.api).read_namespace(teams.ns).metadata.labels
    assert labels[names.LABEL_TEAM] == teams.mine


def test_a_pod_claiming_another_team_is_refused_and_charges_nobody(teams: Teams) -> None:
    claimed = {names.LABEL_TEAM: teams.other}
    message = teams.refused(pod("spender", "production", labels=claimed))
    assert (
        f"metadata.labels[pilotfish.io/team] '{teams.other}' contradicts the team of namespace "
        f"{teams.ns}, '{teams.mine}'"
    ) in message
    flag = f"--labels={names.LABEL_TEAM}={teams.other}"
    res = teams.tenant.kubectl("run", "spender-cli", "--image=example/x:1", flag, check=False)
    assert res.returncode != 0 and "metadata.labels[pilotfish.io/team]" in res.stderr, res.stderr
    assert teams.pods.list_namespaced_pod(teams.ns).items == []
    untouched(teams)


def test_an_admitted_pod_carries_its_namespace_team_and_band(teams: Teams) -> None:
    created = teams.pods.create_namespaced_pod(teams.ns, pod("plain", cpu="500m"))
    assert created.metadata.labels[names.LABEL_TEAM] == teams.mine
    assert created.metadata.labels[names.LABEL_BAND] == "batch"
    assert created.spec.priority_class_name == "pilotfish-batch"
    assert created.spec.priority == 100000


# --- the band: fixed at admission, every class is a band ---------------------------------------


def test_a_pod_naming_no_band_is_batch_and_waits_for_batch_quota(teams: Teams) -> None:
    teams.pods.create_namespaced_pod(teams.ns, pod("first", cpu="2"))
    wait_until(
        "the first batch pod counted",
        lambda: teams.used(teams.mine, "batch").get("cpu") == "2",
        timeout=60,
    )
    waiting = teams.pods.create_namespaced_pod(teams.ns, pod("second", cpu="1"))
    assert [g.name for g in waiting.spec.scheduling_gates or []] == [
        "gates.pilotfish.io/quota-available"
    ]


def test_a_production_class_without_a_band_label_is_charged_to_production(
    teams: Teams,
) -> None:
    message = teams.refused(pod("sneaky", cpu="2", priorityClassName="pilotfish-production"))
    assert f"team {teams.mine}, production cpu: 0 of 1 used, pod asks 2" in message
    admitted = teams.pods.create_namespaced_pod(
        teams.ns, pod("fits", cpu="1", priorityClassName="pilotfish-production")
    )
    assert admitted.metadata.labels[names.LABEL_BAND] == "production"
    assert admitted.spec.priority == 1000000


def test_relabelling_an_admitted_pod_frees_no_quota(teams: Teams) -> None:
    teams.pods.create_namespaced_pod(teams.ns, pod("prod", "production", cpu="1"))
    wait_until(
        "the production pod counted",
        lambda: teams.used(teams.mine, "production").get("cpu") == "1",
        timeout=60,
    )
    relabel = {"metadata": {"labels": {names.LABEL_BAND: "best-effort"}}}
    try:
        teams.pods.patch_namespaced_pod("prod", teams.ns, relabel)
    except ApiException as e:
        assert e.status in (403, 422), e.body  # Pilotfish's labels may be immutable outright
    # A pod created after the relabel is counted in a sync that also saw the relabel.
    teams.pods.create_namespaced_pod(teams.ns, pod("later", "batch", cpu="1"))
    wait_until(
        "the later batch pod counted",
        lambda: teams.used(teams.mine, "batch").get("cpu") == "1",
        timeout=60,
    )
    assert teams.used(teams.mine, "production").get("cpu") == "1"
    message = teams.refused(pod("more", "production", cpu="1"))
    assert f"team {teams.mine}, production cpu: 1 of 1 used, pod asks 1" in message


@pytest.mark.parametrize("cls", ["system-cluster-critical", "system-node-critical"])
def test_system_priority_classes_are_refused(teams: Teams, cls: str) -> None:
    message = teams.refused(pod("critical", priorityClassName=cls))
    assert f"spec.priorityClassName '{cls}' is not allowed in namespace {teams.ns}" in message
    assert "pilotfish-production, pilotfish-batch, pilotfish-best-effort" in message


def test_a_class_contradicting_the_band_label_is_refused(teams: Teams) -> None:
    body = pod("mixed", "batch", priorityClassName="pilotfish-production")
    assert "spec.priorityClassName 'pilotfish-production' contradicts the pod's band 'batch'" in (
        teams.refused(body)
    )


# --- node and scheduler ------------------------------------------------------------------------


def test_naming_a_node_at_creation_is_refused(teams: Teams) -> None:
    node = nodes.node_name(nodes.ZONES[0], 0)
    message = teams.refused(pod("pinned", "batch", cpu="100m", nodeName=node))
    assert f"spec.nodeName '{node}' may not be set when a pod is created in namespace" in message
    assert "skipping the scheduler, the Pilotfish extender, its GatePolicy gates" in message
    assert teams.pods.list_namespaced_pod(teams.ns).items == []


def test_an_unknown_scheduler_is_refused(teams: Teams) -> None:
    message = teams.refused(pod("elsewhere", "batch", cpu="100m", schedulerName="my-scheduler"))
    assert f"spec.schedulerName 'my-scheduler' is not allowed in namespace {teams.ns}" in message


def test_the_pilotfish_scheduler_is_given_and_accepted(teams: Teams) -> None:
    given = teams.pods.create_namespaced_pod(teams.ns, pod("given", "batch", cpu="100m"))
    named = teams.pods.create_namespaced_pod(
        teams.ns, pod("named", "batch", cpu="100m", schedulerName=names.SCHEDULER_NAME)
    )
    assert given.spec.scheduler_name == named.spec.scheduler_name == names.SCHEDULER_NAME
