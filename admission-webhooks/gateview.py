"""An immutable snapshot of every GatePolicy, shaped for the questions admission asks.

Admission asks three things per pod: which policies of its namespace select it, which gate
names those policies declare, and which namespaces claim a gate prefix. The snapshot answers
them without I/O, so the review functions stay pure and a test builds a view from a list of
dicts. Policies are parsed once, when they change, not once per pod.

A policy the model cannot parse (written against a newer CRD, or stored before a schema
rule existed) is kept as `BrokenPolicy` rather than dropped: dropping it would admit its
pods without their gates, which is exactly the silent failure gating exists to prevent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pilotfish.api.gatepolicy import GatePolicy, GatePolicySpec


@dataclass(frozen=True)
class PolicyEntry:
    """One readable GatePolicy: what admission needs of it, nothing else."""

    namespace: str
    name: str
    generation: int
    spec: GatePolicySpec

    def selects(self, labels: Mapping[str, str]) -> bool:
        return self.spec.selector.matches(dict(labels))

    def claims(self, gate: str) -> bool:
        """Whether the gate's name starts with one of this policy's allowedPrefixes."""
        return any(gate.startswith(p) for p in self.spec.allowed_prefixes)


@dataclass(frozen=True)
class BrokenPolicy:
    """A GatePolicy that exists but cannot be read; its namespace fails closed."""

    namespace: str
    name: str
    error: str


def parse_policy(obj: Mapping[str, Any]) -> PolicyEntry | BrokenPolicy:
    """A raw GatePolicy from the API (or an informer) as a view entry."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    try:
        policy = GatePolicy.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return BrokenPolicy(namespace, name, f"{where}: {first['msg']}")
    return PolicyEntry(namespace, name, policy.metadata.generation or 0, policy.spec)


@dataclass(frozen=True)
class GateView:
    """Every GatePolicy of the cluster at one moment, indexed by namespace and by prefix."""

    policies: Mapping[str, tuple[PolicyEntry, ...]] = field(default_factory=dict)
    broken: Mapping[str, tuple[BrokenPolicy, ...]] = field(default_factory=dict)
    # allowedPrefixes entry -> namespaces whose policies list it.
    prefixes: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def build(cls, entries: Iterable[PolicyEntry | BrokenPolicy]) -> GateView:
        """Group by namespace, each group sorted by policy name (the order that decides
        which policy's terms win when two declare the same gate)."""
        good: dict[str, list[PolicyEntry]] = defaultdict(list)
        bad: dict[str, list[BrokenPolicy]] = defaultdict(list)
        for entry in entries:
            if isinstance(entry, PolicyEntry):
                good[entry.namespace].append(entry)
            else:
                bad[entry.namespace].append(entry)
        owners: dict[str, set[str]] = defaultdict(set)
        for ns, es in good.items():
            for e in es:
                for prefix in e.spec.allowed_prefixes:
                    owners[prefix].add(ns)
        return cls(
            policies={ns: tuple(sorted(es, key=lambda e: e.name)) for ns, es in good.items()},
            broken={ns: tuple(sorted(bs, key=lambda b: b.name)) for ns, bs in bad.items()},
            prefixes={p: frozenset(nss) for p, nss in owners.items()},
        )

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> GateView:
        return cls.build(parse_policy(o) for o in objects)

    def in_namespace(self, namespace: str) -> tuple[PolicyEntry, ...]:
        return self.policies.get(namespace, ())

    def broken_in(self, namespace: str) -> tuple[BrokenPolicy, ...]:
        return self.broken.get(namespace, ())

    def selecting(self, namespace: str, labels: Mapping[str, str]) -> tuple[PolicyEntry, ...]:
        """The policies of `namespace` whose selector matches `labels`, by name."""
        return tuple(p for p in self.in_namespace(namespace) if p.selects(labels))

    def claimants(self, gate: str) -> frozenset[str]:
        """Namespaces with a GatePolicy whose allowedPrefixes cover the gate's name.

        An allowed prefix is `subdomain/` and a gate name `subdomain/name`, so a prefix
        covers a gate exactly when it is the gate's own prefix: one lookup, however many
        policies the cluster has.
        """
        return self.prefixes.get(gate_prefix(gate), frozenset())


def gate_prefix(gate: str) -> str:
    """`teamb.example.com/` of `teamb.example.com/ready`; the whole name if it has no slash."""
    head, slash, _ = gate.partition("/")
    return head + slash
