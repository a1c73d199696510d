"""What a tenant may not decide about its own pod: its team, its node, its scheduler (pure).

Every namespace the Pilotfish webhooks see is a tenant namespace (the chart's
`pilotfish.webhookNamespaceSelector` leaves out the control plane's namespaces, Pilotfish's
own, and those the platform labels `pilotfish.io/webhooks=disabled`). There:

- The team is the namespace's `pilotfish.io/team` label, which only the platform can set
  (the built-in `edit` role cannot update namespaces). The webhook copies it onto the pod
  so that readers of the pod alone see it; a pod that claims another team is refused rather
  than silently relabelled, so the author learns where the charge goes.
- `spec.nodeName` at creation is refused: a pod that names its node is bound already, so it
  skips the scheduler, the extender's placement rules, its GatePolicy gates and quota
  placement.
- `spec.schedulerName` must be default-scheduler or pilotfish-scheduler (or the scheduler
  the webhook is told to give band pods): any other scheduler skips the extender. The
  webhook's `--foreign-schedulers` option decides between refusing such pods (the default)
  and rewriting them to pilotfish-scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pilotfish import names
from pilotfish.webhooks.patches import Op, pointer, set_entries

DEFAULT_SCHEDULER: Final = "default-scheduler"
ForeignSchedulers = Literal["refuse", "rewrite"]
FOREIGN_SCHEDULERS: Final[tuple[ForeignSchedulers, ...]] = ("refuse", "rewrite")

# Never tenant namespaces, even if a misconfigured webhook saw them: their pods run at system
# classes on nodes they name (static pods), and refusing them could deadlock the cluster.
SYSTEM_NAMESPACES: Final = frozenset(
    {"kube-system", "kube-public", "kube-node-lease", names.SYSTEM_NAMESPACE}
)


@dataclass(frozen=True)
class TenantPolicy:
    """The webhook's options for tenant pods.

    `scheduler_name`: given to pods on the default scheduler (None: they stay there).
    `foreign_schedulers`: what happens to a pod naming any other scheduler.
    """

    scheduler_name: str | None = None
    foreign_schedulers: ForeignSchedulers = "refuse"

    @property
    def schedulers(self) -> tuple[str, ...]:
        """The schedulers a tenant pod may name, in the order messages list them."""
        out = [DEFAULT_SCHEDULER, names.SCHEDULER_NAME]
        if self.scheduler_name and self.scheduler_name not in out:
            out.append(self.scheduler_name)
        return tuple(out)

    @property
    def rewrite_to(self) -> str:
        return self.scheduler_name or names.SCHEDULER_NAME


def _labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = (pod.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def is_tenant(namespace: str) -> bool:
    return namespace not in SYSTEM_NAMESPACES


def namespace_team(namespace_labels: Mapping[str, str]) -> str | None:
    team = namespace_labels.get(names.LABEL_TEAM)
    return team if isinstance(team, str) and team else None


def team_problem(
    pod: Mapping[str, Any], namespace: str, namespace_labels: Mapping[str, str]
) -> str | None:
    """A `pilotfish.io/team` label on the pod that is not its namespace's team, or None."""
    labels = _labels(pod)
    if names.LABEL_TEAM not in labels:
        return None
    claimed = labels[names.LABEL_TEAM]
    team = namespace_team(namespace_labels)
    if claimed == (team or ""):
        return None
    where = f"metadata.labels[{names.LABEL_TEAM}] {claimed!r}"
    if team is None:
        return (
            f"{where} is not allowed: namespace {namespace} has no team (no {names.LABEL_TEAM} "
            "label), and a pod's team is its namespace's, set by the platform; drop the label"
        )
    return (
        f"{where} contradicts the team of namespace {namespace}, {team!r}: a pod's team is "
        f"its namespace's {names.LABEL_TEAM} label, set by the platform; drop the label or "
        f"set it to {team!r}"
    )


def team_patch(pod: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> list[Op]:
    """JSON patch copying the namespace's team onto the pod (nothing when it has none)."""
    team = namespace_team(namespace_labels)
    meta = pod.get("metadata") or {}
    if team is None or _labels(pod).get(names.LABEL_TEAM) == team:
        return []
    return set_entries(meta.get("labels"), ("metadata", "labels"), {names.LABEL_TEAM: team})


def node_problem(pod: Mapping[str, Any], namespace: str) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    return (
        f"spec.nodeName {node!r} may not be set when a pod is created in namespace "
        f"{namespace}: a pod that names its node is bound at once, skipping the scheduler, "
        "the Pilotfish extender, its GatePolicy gates and quota placement; leave it empty and "
        "choose nodes with nodeSelector or affinity"
    )


def scheduler_problem(pod: Mapping[str, Any], namespace: str, policy: TenantPolicy) -> str | None:
    name = (pod.get("spec") or {}).get("schedulerName")
    if not name or name in policy.schedulers:
        return None
    return (
        f"spec.schedulerName {name!r} is not allowed in namespace {namespace}: tenant pods "
        f"are scheduled by {' or '.join(policy.schedulers)}, which call the Pilotfish "
        "extender; another scheduler would place the pod without it"
    )


def scheduler_patch(pod: Mapping[str, Any], policy: TenantPolicy) -> list[Op]:
    """JSON patch moving the pod to the configured scheduler: from the default scheduler when
    one is configured, from a foreign one when the policy rewrites foreign schedulers."""
    name = (pod.get("spec") or {}).get("schedulerName")
    if name in (None, "", DEFAULT_SCHEDULER):
        want = policy.scheduler_name
    elif name not in policy.schedulers and policy.foreign_schedulers == "rewrite":
        want = policy.rewrite_to
    else:
        want = None
    if not want or want == name:
        return []
    return [{"op": "add", "path": pointer("spec", "schedulerName"), "value": want}]


def spec_problems(
    pod: Mapping[str, Any], namespace: str, policy: TenantPolicy, *, mutating: bool
) -> list[str]:
    """The node and scheduler rules. While mutating, a foreign scheduler the policy rewrites
    is no problem yet; after mutation (validating) any foreign scheduler left is."""
    out = [node_problem(pod, namespace)]
    if not (mutating and policy.foreign_schedulers == "rewrite"):
        out.append(scheduler_problem(pod, namespace, policy))
    return [p for p in out if p]
