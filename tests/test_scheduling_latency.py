"""Scheduling latency by band: creation to PodScheduled, timed only for bindings seen live."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from prometheus_client import REGISTRY

from pilotfish import names
from pilotfish.kube.informer import Obj
from pilotfish.kube.runtime import Runtime
from pilotfish.operators.schedulinglatency import SchedulingLatencyObserver, latency


class Informer:
    def __init__(self) -> None:
        self.handlers: list[Any] = []

    def add_handler(self, handler: Any) -> None:
        self.handlers.append(handler)

    def emit(self, kind: str, obj: Obj, old: Obj | None) -> None:
        for h in self.handlers:
            h(kind, obj, old)


def observer() -> tuple[SchedulingLatencyObserver, Informer]:
    informer = Informer()
    rt = SimpleNamespace(factory=SimpleNamespace(informer=lambda *_a, **_k: informer))
    return SchedulingLatencyObserver(cast(Runtime, rt)), informer


def pod(node: str | None, scheduled_at: str | None, band: str | None = "production") -> Obj:
    conditions = (
        [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at}]
        if scheduled_at
        else []
    )
    return {
        "metadata": {
            "name": "p",
            "namespace": "shop",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {names.LABEL_BAND: band} if band else {},
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"conditions": conditions},
    }


def count(band: str) -> float:
    value = REGISTRY.get_sample_value("pilotfish_scheduling_latency_seconds_count", {"band": band})
    return value or 0.0


def total(band: str) -> float:
    value = REGISTRY.get_sample_value("pilotfish_scheduling_latency_seconds_sum", {"band": band})
    return value or 0.0


def test_latency_is_creation_to_podscheduled() -> None:
    assert latency(pod("n1", "2026-01-01T00:00:07Z")) == 7.0
    assert latency(pod("n1", None)) is None  # bound, condition not written yet: no guess


def test_a_binding_seen_live_is_timed_by_band() -> None:
    _, informer = observer()
    before, before_sum = count("production"), total("production")
    informer.emit("MODIFIED", pod("n1", "2026-01-01T00:00:03Z"), pod(None, None))
    assert count("production") == before + 1
    assert total("production") == before_sum + 3.0
    unlabelled = count("none")
    informer.emit("MODIFIED", pod("n1", "2026-01-01T00:00:01Z", band=None), pod(None, None))
    assert count("none") == unlabelled + 1


def test_pods_already_bound_or_still_unbound_are_not_timed() -> None:
    _, informer = observer()
    before = count("batch")
    bound = pod("n1", "2026-01-01T00:01:00Z", band="batch")
    informer.emit("ADDED", bound, None)  # listed already bound (operator restart)
    informer.emit("MODIFIED", bound, bound)  # a later change to a bound pod
    informer.emit("MODIFIED", pod(None, None, band="batch"), pod(None, None, band="batch"))
    informer.emit("SYNC", bound, bound)
    assert count("batch") == before
