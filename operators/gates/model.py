"""What the gate controller observes, as small immutable views parsed once from raw dicts.

The decision function never touches raw API objects: it gets these views, so it is pure and
its tests build them with a few keyword arguments. Parsing lives here, next to the views, so
the wire shape of each object (a pod's gates and record, a GateSignal's Ready condition, a
node's image list) is read in exactly one place.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from pilotfish import gates, names, quota
from pilotfish.ledger import Ledger
from pilotfish.quota import Resources
from pilotfish.timeutil import parse_time_or_none as parse_ts

log = logging.getLogger("pilotfish.gates")

# The owner written into each gate record by the webhook: the only gates this controller removes.
OWNER: Final = names.SA_OPERATOR
# Written by the controller in the same conditional patch that removes gates: gate -> when,
# on what evidence, from which version. The pod itself thus says which gates the controller
# released, so a release whose audit line was lost to a kill -9 is audited after restart.
ANNOTATION_RELEASED: Final = "gates.pilotfish.io/released"
EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class PodCondition:
    """One entry of a pod's status.conditions, as far as the controller reads it."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = 0  # the generation of the object it describes (0: not said)


@dataclass(frozen=True)
class PodView:
    """A gated (label `gates.pilotfish.io/gated=true`) pod, reduced to what decisions read."""

    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    generation: int = 0  # metadata.generation: every spec change (a gate removed) moves it
    labels: Mapping[str, str] = field(default_factory=dict)
    created: datetime.datetime = EPOCH
    priority: int = 0
    # Every scheduling gate on the pod, Pilotfish's and others', in spec order.
    scheduling_gates: tuple[str, ...] = ()
    # The webhook's record, by gate name ({} when the pod carries none or a malformed one).
    record: Mapping[str, gates.GateRecord] = field(default_factory=dict)
    record_created: str = ""
    record_error: str = ""
    requests: Resources = field(default_factory=dict)
    images: tuple[str, ...] = ()
    phase: str = "Pending"
    deleting: bool = False
    node_name: str = ""
    band: str = "batch"
    scheduled: PodCondition | None = None  # the scheduler's PodScheduled condition
    state: PodCondition | None = None  # our gates.pilotfish.io/State condition
    released_log: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # (name, uid) of the BatchWorkload that is the pod's controller (`gates.batch_owner`).
    batch_owner: tuple[str, str] | None = None
    # Set by `terms.verified` from the controller's GatePolicy view, never from the pod: the
    # condition that releases each gate this controller may remove, and, for each other gate
    # of ours, why its record cannot be trusted. Empty until verified: nothing is managed.
    terms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    untrusted: Mapping[str, str] = field(default_factory=dict)

    # Computed once per view (a view is never changed, only copied with new terms): a round
    # reads each pod's key and Pilotfish gates a dozen times or more, and at 2,000 gated
    # pods recomputing them was a fifth of `decide`.
    @functools.cached_property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def alive(self) -> bool:
        """Neither finished nor on its way out: the only pods decisions act on."""
        return not self.terminal and not self.deleting

    @functools.cached_property
    def pilotfish_gates(self) -> tuple[str, ...]:
        return tuple(g for g in self.scheduling_gates if gates.is_pilotfish_gate(g))

    @property
    def released(self) -> bool:
        """No Pilotfish gate left: the scheduler may try it (another owner's gate aside)."""
        return not self.pilotfish_gates

    def managed(self, gate: str) -> bool:
        """A gate this controller may remove: a Pilotfish gate whose record names us and
        whose terms its GatePolicy (or the quota rule) confirms."""
        return gates.is_pilotfish_gate(gate) and gate in self.terms and gate in self.record

    def with_terms(
        self, terms: Mapping[str, Mapping[str, Any]], untrusted: Mapping[str, str]
    ) -> PodView:
        """A copy with the terms set. Every round verifies every gated pod, and `replace`
        (which re-runs `__init__` over every field) cost half of that at 20,000 pods."""
        out = copy.copy(self)
        object.__setattr__(out, "terms", dict(terms))
        object.__setattr__(out, "untrusted", dict(untrusted))
        return out

    @property
    def gang(self) -> str | None:
        return self.labels.get(gates.LABEL_GANG) or None

    @property
    def review_flagged(self) -> bool:
        return self.labels.get(gates.LABEL_REVIEW) == "required"

    def deadline(self, gate: str) -> datetime.datetime | None:
        rec = self.record.get(gate)
        return parse_ts(rec.deadline) if rec else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _conditions(status: Mapping[str, Any]) -> dict[str, PodCondition]:
    out: dict[str, PodCondition] = {}
    for c in status.get("conditions") or []:
        t = str(c.get("type", ""))
        out[t] = PodCondition(
            t,
            str(c.get("status", "Unknown")),
            str(c.get("reason") or ""),
            str(c.get("message") or ""),
            str(c.get("lastTransitionTime") or ""),
            _int(c.get("observedGeneration")),
        )
    return out


def _released_log(raw: Any) -> dict[str, dict[str, str]]:
    if not isinstance(raw, str) or not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(g): {str(k): str(v) for k, v in entry.items()}
        for g, entry in data.items()
        if isinstance(entry, dict)
    }


def pod_view(obj: Mapping[str, Any]) -> PodView:
    """Parse a raw pod. Malformed parts degrade to safe values (no record: nothing released)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    record = gates.read_record(obj)
    raw_record = (meta.get("annotations") or {}).get(gates.ANNOTATION_RECORD)
    record_error = ""
    if record is None and raw_record:
        record_error = f"annotation {gates.ANNOTATION_RECORD} is not a valid gate record"
    try:
        requests = quota.pod_requests(obj)
    except ValueError as e:  # an unparseable quantity: the API server would not store one
        requests = {"pods": Fraction(1)}
        record_error = record_error or f"unreadable resource requests: {e}"
    images = tuple(
        str(c.get("image") or "")
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        if c.get("image")
    )
    conds = _conditions(status)
    return PodView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        generation=_int(meta.get("generation")),
        labels=dict(meta.get("labels") or {}),
        created=parse_ts(meta.get("creationTimestamp")) or EPOCH,
        priority=int(spec.get("priority") or 0),
        scheduling_gates=tuple(gates.scheduling_gates(obj)),
        record=dict(record.gates) if record else {},
        record_created=record.created if record else "",
        record_error=record_error,
        requests=requests,
        images=images,
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        node_name=str(spec.get("nodeName") or ""),
        band=quota.pod_band(obj),
        scheduled=conds.get("PodScheduled"),
        state=conds.get(gates.POD_CONDITION),
        released_log=_released_log((meta.get("annotations") or {}).get(ANNOTATION_RELEASED)),
        batch_owner=gates.batch_owner(obj),
    )


@dataclass(frozen=True)
class BatchView:
    """A BatchWorkload as the gang gate reads it: who it is (uid) and its gang's size."""

    namespace: str
    name: str
    uid: str
    gang: int | None = None  # None: no usable spec.gang (`problem` says why)
    problem: str = ""


def batch_view(obj: Mapping[str, Any]) -> BatchView:
    meta = obj.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    gang = (obj.get("spec") or {}).get("gang")
    if gang is None:
        return BatchView(ns, name, uid, problem="it has no spec.gang")
    if isinstance(gang, bool) or not isinstance(gang, int) or gang < 1:
        return BatchView(ns, name, uid, problem=f"its spec.gang {gang!r} is not a positive integer")
    return BatchView(ns, name, uid, gang)


@dataclass(frozen=True)
class SignalView:
    """A GateSignal (pilotfish.io/v1alpha1, namespaced): raised when its Ready is True."""

    namespace: str
    name: str
    ready: str = "Unknown"  # the Ready condition's status; Unknown when it has none
    resource_version: str = ""
    transition_time: str = ""
    reason: str = ""


def signal_view(obj: Mapping[str, Any]) -> SignalView:
    meta = obj.get("metadata") or {}
    ready = _conditions(obj.get("status") or {}).get("Ready")
    return SignalView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        ready=ready.status if ready else "Unknown",
        resource_version=str(meta.get("resourceVersion") or ""),
        transition_time=ready.last_transition_time if ready else "",
        reason=ready.reason if ready else "",
    )


@dataclass(frozen=True)
class NodeView:
    """A node as the Image condition sees it: Ready or not, and the images it holds."""

    name: str
    ready: bool
    images: frozenset[str] = frozenset()


def normalize_image(ref: str) -> str:
    """The canonical form of an image reference, so `nginx` on a pod matches
    `docker.io/library/nginx:latest` in a node's image list (as the kubelet reports it)."""
    ref = ref.strip()
    name, _, digest = ref.partition("@")
    first, _, rest = name.partition("/")
    if not rest:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    last = name.rsplit("/", 1)[-1]
    if not digest and ":" not in last:
        name += ":latest"
    return f"{name}@{digest}" if digest else name


def node_view(obj: Mapping[str, Any]) -> NodeView:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    ready = _conditions(status).get("Ready")
    images = frozenset(
        normalize_image(str(n))
        for img in status.get("images") or []
        for n in img.get("names") or []
    )
    return NodeView(str(meta.get("name") or ""), bool(ready and ready.status == "True"), images)


@dataclass(frozen=True)
class QuotaView:
    """A TeamQuota as the one quota ledger reads it (`pilotfish.ledger`): limits per band
    (None: the band is not granted), used and reserved."""

    name: str
    team: str
    limits: Mapping[str, Resources | None]
    ledger: Ledger


def quota_view(obj: Mapping[str, Any]) -> QuotaView:
    book = Ledger.of(obj)
    return QuotaView(name=book.name, team=book.team, limits=book.limits, ledger=book)


@dataclass(frozen=True)
class Pacing:
    """Release limits of one tenant (namespace); None means unlimited."""

    releases_per_second: float | None = None
    max_in_flight: int | None = None
    policies: tuple[str, ...] = ()


def namespace_pacing(policies: list[Mapping[str, Any]]) -> dict[str, Pacing]:
    """The pacing of each namespace: the tightest limits of all its GatePolicies, so adding a
    policy can only slow a tenant's releases, never speed them past another policy's cap."""
    out: dict[str, Pacing] = {}
    for obj in sorted(policies, key=lambda o: str((o.get("metadata") or {}).get("name"))):
        meta = obj.get("metadata") or {}
        pacing = (obj.get("spec") or {}).get("pacing") or {}
        rate, cap = pacing.get("releasesPerSecond"), pacing.get("maxInFlight")
        if rate is None and cap is None:
            continue
        ns = str(meta.get("namespace") or "")
        cur = out.get(ns, Pacing())
        out[ns] = Pacing(
            releases_per_second=_min_rate(cur.releases_per_second, rate),
            max_in_flight=_min_cap(cur.max_in_flight, cap),
            policies=(*cur.policies, str(meta.get("name"))),
        )
    return out


def _min_rate(a: float | None, b: Any) -> float | None:
    if isinstance(b, bool) or not isinstance(b, int | float) or b <= 0:
        return a
    return float(b) if a is None else min(a, float(b))


def _min_cap(a: int | None, b: Any) -> int | None:
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        return a
    return b if a is None else min(a, b)
