"""API Priority and Fairness as benchmarks/api_fairness.py turns it: which FlowSchema and
level the API server puts a user's writes in, a level's shares, Pilotfish's schemas removed,
and a namespace taken out of Pilotfish's webhooks."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import until_pods_admitted
from pilotfish import names
from pilotfish.kube.rest import NAMESPACES, Rest

FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
SCHEMAS = (
    "pilotfish-production",
    "pilotfish-batch",
    "pilotfish-batch-submissions",
    "pilotfish-tenants",
)
LEVELS = ("pilotfish-production", "pilotfish-batch", "pilotfish-tenants", "pilotfish-tenant-pods")
# A pod spec Pilotfish's tenancy rules refuse: it names a scheduler nobody runs.
SCHEDULED_BY_NOBODY = {"schedulerName": "nobody"}


async def classification(rest: Rest, user: str, namespace: str) -> dict[str, str | None]:
    """The FlowSchema and priority level the API server puts `user`'s writes in now (a
    patch of ConfigMap `probe` in `namespace`, which `user` may write)."""
    resp = await rest.api.send(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/configmaps/probe",
        params=None,
        headers={"Impersonate-User": user, "Content-Type": "application/merge-patch+json"},
        body={"data": {"probe": str(time.time())}},
        request_timeout=30,
    )
    await resp.read()
    by_uid: dict[str, str] = {}
    for kind in ("flowschemas", "prioritylevelconfigurations"):
        items, _ = await rest.list_pages(f"{FLOWCONTROL}/{kind}")
        by_uid |= {i["metadata"]["uid"]: i["metadata"]["name"] for i in items}
    schema = resp.headers.get("X-Kubernetes-PF-FlowSchema-UID")
    level = resp.headers.get("X-Kubernetes-PF-PriorityLevel-UID")
    return {"flowschema": by_uid.get(schema or ""), "priority_level": by_uid.get(level or "")}


async def tune_level(
    rest: Rest, level: str, shares: int | None, borrowing: int | None = None
) -> dict[str, Any]:
    """The chart's level as installed, or with the shares and borrowing cap asked for
    (--tenants-shares, --tenants-borrowing, --pod-shares: to find out where fairness starts
    to bite)."""
    path = f"{FLOWCONTROL}/prioritylevelconfigurations/{level}"
    limited: dict[str, Any] = {}
    if shares is not None:
        limited["nominalConcurrencyShares"] = shares
    if borrowing is not None:
        limited["borrowingLimitPercent"] = borrowing
    if limited:
        await rest.patch(path, {"spec": {"limited": limited}})
    obj = await rest.get(path)
    spec: dict[str, Any] = obj["spec"]["limited"]
    return {k: v for k, v in spec.items() if k != "limitResponse"}


async def remove_flow_control(rest: Rest) -> None:
    """The WITHOUT phase: Pilotfish's FlowSchemas and levels gone; the built-ins remain."""
    for name in SCHEMAS:
        await rest.delete(f"{FLOWCONTROL}/flowschemas/{name}")
    for name in LEVELS:
        await rest.delete(f"{FLOWCONTROL}/prioritylevelconfigurations/{name}")


async def webhooks_off(rest: Rest, namespace: str) -> None:
    """Take `namespace` out of Pilotfish's webhooks (the chart's namespaceSelector), and wait
    until the API server no longer calls them there: a pod the tenancy rules refuse (it
    names a scheduler nobody runs) is then admitted in a dry run."""
    labels = {names.LABEL_WEBHOOKS: names.WEBHOOKS_DISABLED}
    await rest.patch(NAMESPACES.path(name=namespace), {"metadata": {"labels": labels}})
    await until_pods_admitted(
        rest, namespace, f"the webhooks to leave {namespace} alone", (403,), SCHEDULED_BY_NOBODY
    )
