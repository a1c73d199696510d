"""What a tenant may not decide about its pod: team, band, priority class, node, scheduler.

Each attack is tried through the composed reviews (`pods.mutate`, then `pods.validate` on
the mutated pod, then `pods.quota_verdict`), the way the API server calls them.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import pytest

from pilotfish import quota
from pilotfish.webhooks import pods, tenancy
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.teamview import TeamSnapshot
from pilotfish.webhooks.tenancy import TenantPolicy

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SHOP = {"pilotfish.io/team": "payments"}
REFUSE = TenantPolicy()


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "shop", "uid": "u1", "labels": labels or {}},
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
            "priority": 0,
            **spec,
        },
    }


def request(obj: dict[str, Any], namespace: str = "shop") -> dict[str, Any]:
    return {
        "uid": "r",
        "operation": "CREATE",
        "namespace": namespace,
        "kind": {"kind": "Pod"},
        "object": obj,
    }


def quota_of(team: str, cpu: str = "10", used: str = "0") -> dict[str, Any]:
    return {
        "metadata": {"name": team, "generation": 1, "resourceVersion": "3"},
        "spec": {"team": team, "bands": {b: {"cpu": cpu} for b in ("production", "batch")}},
        "status": {"used": {b: {"cpu": used} for b in ("production", "batch")}},
    }


def snapshot(**namespaces: dict[str, str]) -> TeamSnapshot:
    return TeamSnapshot(
        {"shop": SHOP, "lab": {}, **namespaces},
        (quota_of("payments"), quota_of("search", used="9")),
    )


def admit(
    obj: dict[str, Any],
    namespace: str = "shop",
    team: TeamSnapshot | None = None,
    policy: TenantPolicy = REFUSE,
) -> dict[str, Any] | str:
    """The admitted pod, or the first denial's message, as the API server would see it."""
    team = team or snapshot()
    mutation = pods.mutate(
        request(obj, namespace),
        GateView(),
        NOW,
        team,
        policy.scheduler_name,
        foreign_schedulers=policy.foreign_schedulers,
    )
    if not mutation.allowed:
        return mutation.message
    out: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(obj), list(mutation.patch))
    final = request(out, namespace)
    checked = pods.validate(final, GateView(), team, policy.scheduler_name)
    if not checked.allowed:
        return checked.message
    verdict = pods.quota_verdict(final, team, NOW)
    if isinstance(verdict, Decision) and not verdict.allowed:
        return verdict.message
    return out


# --- team: the namespace's, never the pod's --------------------------------------------------


def test_the_pod_gets_its_namespace_team() -> None:
    out = admit(pod({"app": "web"}))
    assert isinstance(out, dict)
    assert out["metadata"]["labels"] == {
        "app": "web",
        "pilotfish.io/team": "payments",
        "pilotfish.io/band": "batch",
    }


def test_claiming_another_team_is_refused_naming_label_value_and_namespace_team() -> None:
    assert admit(pod({"pilotfish.io/team": "search"})) == (
        "metadata.labels[pilotfish.io/team] 'search' contradicts the team of namespace shop, "
        "'payments': a pod's team is its namespace's pilotfish.io/team label, set by the "
        "platform; drop the label or set it to 'payments'"
    )
    assert isinstance(admit(pod({"pilotfish.io/team": "payments"})), dict)


def test_claiming_a_team_in_a_namespace_without_one_is_refused() -> None:
    assert admit(pod({"pilotfish.io/team": "search"}), "lab") == (
        "metadata.labels[pilotfish.io/team] 'search' is not allowed: namespace lab has no team "
        "(no pilotfish.io/team label), and a pod's team is its namespace's, set by the "
        "platform; drop the label"
    )


def test_the_validating_review_catches_a_team_label_changed_after_mutation() -> None:
    """Another mutating webhook (or a reinvocation) may rewrite labels after ours."""
    out = admit(pod())
    assert isinstance(out, dict)
    out["metadata"]["labels"]["pilotfish.io/team"] = "search"
    decision = pods.validate(request(out), GateView(), snapshot())
    assert not decision.allowed and "'search' contradicts" in decision.message


def test_accounting_reads_the_namespace_team_and_the_admitted_class() -> None:
    forged = pod({"pilotfish.io/team": "search", "pilotfish.io/band": "best-effort"})
    forged["spec"]["priorityClassName"] = "pilotfish-production"
    assert quota.pod_team(forged, SHOP) == "payments"
    assert quota.pod_team(forged, {}) is None
    assert quota.pod_band(forged) == "production", "a relabelled pod keeps its class's band"


# --- band and priority class -----------------------------------------------------------------


@pytest.mark.parametrize("cls", ["system-cluster-critical", "system-node-critical", "high"])
def test_any_class_but_the_pilotfish_ones_is_refused(cls: str) -> None:
    out = admit(pod(priorityClassName=cls))
    assert isinstance(out, str)
    assert out.startswith(f"spec.priorityClassName {cls!r} is not allowed in namespace shop")


def test_a_production_class_without_a_band_label_is_production_and_charged() -> None:
    team = TeamSnapshot({"shop": SHOP}, (quota_of("payments", cpu="1", used="1"),))
    assert admit(pod(priorityClassName="pilotfish-production"), team=team) == (
        "team payments, production cpu: 1 of 1 used, pod asks 1"
    )


def test_a_band_label_that_is_no_band_is_refused() -> None:
    assert admit(pod({"pilotfish.io/band": "gold"})) == (
        "band 'gold' (from the pod label pilotfish.io/band) is not one of "
        "production, batch, best-effort"
    )


def test_every_broken_rule_is_named_at_once() -> None:
    out = admit(
        pod(
            {"pilotfish.io/team": "search"},
            nodeName="n1",
            schedulerName="mine",
            priorityClassName="system-node-critical",
        )
    )
    assert isinstance(out, str)
    fields = ("spec.nodeName", "spec.schedulerName", "pilotfish.io/team", "priorityClassName")
    assert all(f in out for f in fields), out


# --- node and scheduler ----------------------------------------------------------------------


def test_naming_a_node_is_refused() -> None:
    out = admit(pod(nodeName="kwok-zone-a-0"))
    assert isinstance(out, str) and out.startswith("spec.nodeName 'kwok-zone-a-0' may not be set")


def test_a_foreign_scheduler_is_refused_by_default() -> None:
    assert admit(pod(schedulerName="my-scheduler")) == (
        "spec.schedulerName 'my-scheduler' is not allowed in namespace shop: tenant pods are "
        "scheduled by default-scheduler or pilotfish-scheduler, which call the Pilotfish "
        "extender; another scheduler would place the pod without it"
    )


def test_a_foreign_scheduler_is_rewritten_when_the_policy_says_so() -> None:
    out = admit(pod(schedulerName="my-scheduler"), policy=TenantPolicy(None, "rewrite"))
    assert isinstance(out, dict) and out["spec"]["schedulerName"] == "pilotfish-scheduler"
    policy = TenantPolicy("extended", "rewrite")
    out = admit(pod(schedulerName="my-scheduler"), policy=policy)
    assert isinstance(out, dict) and out["spec"]["schedulerName"] == "extended"


@pytest.mark.parametrize(
    ("name", "configured", "want"),
    [
        ("default-scheduler", None, "default-scheduler"),
        ("default-scheduler", "pilotfish-scheduler", "pilotfish-scheduler"),
        (None, "pilotfish-scheduler", "pilotfish-scheduler"),
        ("pilotfish-scheduler", None, "pilotfish-scheduler"),
        ("extended", "extended", "extended"),
    ],
)
def test_accepted_schedulers(name: str | None, configured: str | None, want: str) -> None:
    obj = pod() if name is None else pod(schedulerName=name)
    out = admit(obj, policy=TenantPolicy(configured))
    assert isinstance(out, dict) and out["spec"].get("schedulerName", "default-scheduler") == want


# --- system namespaces and tools ---------------------------------------------------------


@pytest.mark.parametrize("namespace", sorted(tenancy.SYSTEM_NAMESPACES))
def test_system_namespaces_are_left_alone(namespace: str) -> None:
    obj = pod(
        {"pilotfish.io/team": "search"},
        nodeName="n1",
        schedulerName="mine",
        priorityClassName="system-node-critical",
    )
    assert pods.mutate(request(obj, namespace), GateView(), NOW, snapshot()).patch == ()
    assert pods.validate(request(obj, namespace), GateView(), snapshot()).allowed
    assert pods.quota_verdict(request(obj, namespace), snapshot(), NOW) == Decision.allow()


def test_without_a_team_view_the_spec_rules_still_hold() -> None:
    decision = pods.mutate(
        request(pod(priorityClassName="system-cluster-critical")), GateView(), NOW
    )
    assert not decision.allowed and "spec.priorityClassName" in decision.message
    assert pods.mutate(request(pod({"pilotfish.io/team": "x"})), GateView(), NOW).allowed
