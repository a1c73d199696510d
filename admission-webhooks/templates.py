"""Workload pod templates checked at admission by a server-side dry run of their pod.

A template's pod spec is free-form in the CRDs (`pilotfish.api.base.PodTemplate`: copying the
Pod schema into them would pin them to one Kubernetes version), so without this a
ServiceWorkload with no image is stored and the operator then loops on FailedCreate.
Instead the workloads webhook asks the API server to create, as a dry run, the very pod the
operator would create (`pilotfish.podtemplate.pod_body`) and denies with the API server's
answer, its field paths re-rooted at the workload (`spec.containers[0].image` ->
`spec.template.spec.containers[0].image`).

Choices, and why:
- One call per review, bounded by DRY_RUN_SECONDS, below the webhook's `timeoutSeconds`
  (10 in the chart), so the review answers before the API server gives up on it.
- A dry run that cannot be done (transport error, timeout, 5xx, 429, the webhooks not allowed
  to create pods) denies, saying the template could not be checked: fail closed, as every
  Pilotfish check in tenant namespaces does; kube-system and pilotfish-system never reach
  this webhook.
- AlreadyExists is a pass: the API server only looks for a name clash after the pod passed
  every check, and the operator's real pods get random names.
- The dry-run pod drops `blockOwnerDeletion`: setting it requires the right to update the
  workload's finalizers (OwnerReferencesPermissionEnforcement), which the webhooks do not
  hold and which says nothing about the template.
- The dry-run pod passes through Pilotfish's own pod webhooks, so a template that breaks a
  pod rule (a gate prefix, a band) is refused too. A dry run reserves no quota
  (`pods.quota_verdict`), and the pod validating webhook skips the quota verdict altogether
  for the webhooks' own dry runs (`is_template_check`): a team at its quota is a state of the
  team, not a fault of the template, and its workload must still be accepted (its pods then
  wait for, or are refused, quota when they are created). A tenant ServiceAccount of the
  same name gains nothing from the skip, as a dry run creates nothing. A pod rule that
  depends on who creates the pod judges the webhooks' account here, the operator's later.
- Least privilege: the webhooks' ServiceAccount may create pods, and any such create that
  is not a dry run is refused in every namespace: in the namespaces the pod webhooks see, by
  the validating review itself (`dry_run_only`; failing closed, so also while the webhooks
  are down); in those taken out of them (`pilotfish.io/webhooks: disabled`), by the chart's
  ValidatingAdmissionPolicy `pilotfish-webhooks-dry-run-only`; in the system namespaces, by
  `pilotfish-system-namespaces`, which refuses even its dry runs. The policy is bound to the
  disabled namespaces only because CEL, even a matchCondition on the user alone, costs the
  API server a conversion of the whole pod on every create it matches.
- Checked on CREATE, and on UPDATE only when the template changed (a scale or a band change
  costs no call).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import aiohttp

from pilotfish.kube.rest import PODS, ApiError, Rest
from pilotfish.names import SA_WEBHOOKS
from pilotfish.podtemplate import pod_body, pod_name
from pilotfish.webhooks.admission import Decision

Status = Mapping[str, Any]
# (namespace, pod) -> None when the API server would create the pod, else its Status.
DryRun = Callable[[str, Mapping[str, Any]], Awaitable[Status | None]]

DRY_RUN_SECONDS: Final = 8.0
# What the operator puts in a pod's name and revision label, at the real lengths (a revision
# hash is 10 characters, a name suffix 5), so a name too long for a pod is caught too.
PLACEHOLDER_REVISION: Final = "dryrunxxxx"
PLACEHOLDER_SUFFIX: Final = "xxxxx"
# A CREATE is reviewed before the object is stored; its uid is normally set by then.
PLACEHOLDER_UID: Final = "00000000-0000-0000-0000-000000000000"
DEFAULT_BAND: Final = {"ServiceWorkload": "production", "BatchWorkload": "batch"}
TEMPLATE: Final = "spec.template"
UNAVAILABLE_REASONS: Final = frozenset(
    {"Timeout", "ServerTimeout", "ServiceUnavailable", "InternalError", "TooManyRequests"}
)
# encoding/json's UnmarshalTypeError, as the API server passes it on for a pod it cannot
# decode: "... cannot unmarshal string into Go struct field PodSpec.spec.containers of ...".
_DECODE_FIELD = re.compile(
    r"cannot unmarshal (\S+) into Go struct field \w+\.([\w.\[\]]+) of type (\S+)"
)


def _username(request: Mapping[str, Any]) -> str:
    info = request.get("userInfo")
    return str(info.get("username") or "") if isinstance(info, Mapping) else ""


def is_template_check(request: Mapping[str, Any]) -> bool:
    """A pod review that is the workloads webhook's own dry run of a template."""
    account = _username(request).split(":")
    return (
        request.get("dryRun") is True
        and len(account) == 4
        and account[:2] == ["system", "serviceaccount"]
        and account[3] == SA_WEBHOOKS
    )


DRY_RUN_ONLY: Final = (
    f"{SA_WEBHOOKS} may only create pods as a dry run (the check of workload templates)"
)


def dry_run_only(request: Mapping[str, Any], webhooks_user: str) -> Decision | None:
    """Refuse a pod create by the webhooks' own account (`webhooks_user`) that is not a dry
    run; None for anything else."""
    user = _username(request)
    if user != webhooks_user or request.get("operation") != "CREATE":
        return None
    if request.get("dryRun") is True:  # exactly: anything else is refused
        return None
    namespace = request.get("namespace") or ""
    return Decision.deny(f"pod create in namespace {namespace} refused for {user}: {DRY_RUN_ONLY}")


def template_changed(request: Mapping[str, Any]) -> bool:
    if request.get("operation") != "UPDATE":
        return True
    new, old = request.get("object") or {}, request.get("oldObject") or {}
    return bool((new.get("spec") or {}).get("template") != (old.get("spec") or {}).get("template"))


def dry_run_pod(workload: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The pod the operator would make of the workload's template (its first, for a batch)."""
    meta = dict(workload.get("metadata") or {})
    meta["namespace"] = meta.get("namespace") or namespace
    meta["name"] = meta.get("name") or meta.get("generateName") or "workload"
    meta["uid"] = meta.get("uid") or PLACEHOLDER_UID
    owner = {**workload, "metadata": meta}
    template = (workload.get("spec") or {}).get("template") or {}
    kind = str(workload.get("kind", "ServiceWorkload"))
    name = pod_name(meta["name"], PLACEHOLDER_REVISION, PLACEHOLDER_SUFFIX)
    pod = pod_body(owner, template, PLACEHOLDER_REVISION, name, DEFAULT_BAND.get(kind, "batch"))
    for ref in pod["metadata"]["ownerReferences"]:
        ref.pop("blockOwnerDeletion", None)
    return pod


def reroot(field: str) -> str:
    """A pod's field path as the path of the workload field it came from."""
    if field.startswith(("spec.", "spec[")) or field == "spec":
        return f"{TEMPLATE}.{field}"
    if field.startswith(("metadata.labels", "metadata.annotations")):
        return f"{TEMPLATE}.{field}"
    if field == "metadata.name":
        return field  # the pod's name is made of the workload's
    return TEMPLATE


def _fields(status: Status) -> list[str]:
    """'<workload field>: <what is wrong>' for every cause the API server gave."""
    causes = (status.get("details") or {}).get("causes") or []
    out = []
    for cause in causes:
        if isinstance(cause, Mapping) and cause.get("field"):
            out.append(f"{reroot(str(cause['field']))}: {cause.get('message') or 'invalid'}")
    if out:
        return out
    found = _DECODE_FIELD.search(str(status.get("message", "")))
    if found:
        got, field, want = found.groups()
        return [f"{reroot(field)}: Invalid type: got {got}, expected {want}"]
    return []


def _unavailable(status: Status) -> bool:
    code = int(status.get("code") or 0)
    if code >= 500 or code == 429 or status.get("reason") in UNAVAILABLE_REASONS:
        return True
    # RBAC's answer, not a template's fault: the webhooks' ServiceAccount lacks `create pods`.
    return code == 403 and 'cannot create resource "pods"' in str(status.get("message", ""))


def cannot_check(kind: str, why: str) -> Decision:
    return Decision.deny(
        f"the {kind}'s {TEMPLATE} could not be checked (a dry-run create of its pod failed: "
        f"{why}); nothing was stored, retry",
        code=503,
        reason="ServiceUnavailable",
    )


def verdict(kind: str, status: Status | None) -> Decision:
    """The decision on a template from the API server's answer to the dry run of its pod."""
    if status is None:
        return Decision.allow()
    code = int(status.get("code") or 0)
    message = str(status.get("message") or status.get("reason") or "no message")
    if code == 409 or status.get("reason") == "AlreadyExists":
        return Decision.allow()
    if _unavailable(status):
        return cannot_check(kind, message)
    named = _fields(status) or [f"{TEMPLATE}: invalid"]
    return Decision.deny(
        f"{'; '.join(named)} (the {kind}'s {TEMPLATE} makes a pod the API server refuses: "
        f"{message})",
        code=422,
        reason="Invalid",
    )


async def check(request: Mapping[str, Any], dry_run: DryRun) -> Decision:
    """Dry-run the pod of a workload CREATE, or of an UPDATE that changed the template."""
    if not template_changed(request):
        return Decision.allow()
    workload = request.get("object") or {}
    kind = str((request.get("kind") or {}).get("kind") or workload.get("kind") or "workload")
    namespace = str(request.get("namespace") or "")
    pod = dry_run_pod(workload, namespace)
    try:
        async with asyncio.timeout(DRY_RUN_SECONDS):
            status = await dry_run(namespace, pod)
    except TimeoutError:
        return cannot_check(kind, f"no answer within {DRY_RUN_SECONDS:g} s")
    except (aiohttp.ClientError, OSError) as e:
        return cannot_check(kind, f"{type(e).__name__}: {e}")
    return verdict(kind, status)


def dry_run_with(rest: Rest, seconds: float = DRY_RUN_SECONDS) -> DryRun:
    """The real dry run: POST the pod with dryRun=All, bounded on both ends by `seconds`."""

    async def dry_run(namespace: str, pod: Mapping[str, Any]) -> Status | None:
        try:
            await rest.request(
                "POST",
                PODS.path(namespace),
                params={"dryRun": "All", "timeout": f"{int(seconds)}s"},
                body=dict(pod),
                request_timeout=seconds,
            )
        except ApiError as e:
            fallback = {"code": e.status, "reason": e.reason, "message": e.message}
            return e.body or fallback
        return None

    return dry_run
