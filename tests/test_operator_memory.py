"""The operator_memory benchmark's counting: API server metrics and audit events into watches
per resource and selector, /proc into memory. A miscount here would pass or fail issue 9's
"one watch per resource kind and selector" for the wrong reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.operator_memory import summary
from benchmarks.probes.watches import (
    OPERATOR_USER,
    AuditTail,
    Ledger,
    WatchKey,
    apiserver_watches,
    most_watches_per_key,
    proc_memory,
    several_watches,
    watch_delta,
    watch_key,
    watch_table,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
KOPF = "kopf/1.37.2"


def longrunning(resource: str, scope: str, verb: str, n: int, **extra: str) -> str:
    labels = {"component": "apiserver", "group": "", "resource": resource, "scope": scope}
    labels |= {"subresource": "", "verb": verb, "version": "v1", **extra}
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"apiserver_longrunning_requests{{{text}}} {n}\n"


METRICS = (
    "# HELP apiserver_longrunning_requests [STABLE] Gauge of active long-running requests.\n"
    "# TYPE apiserver_longrunning_requests gauge\n"
    + longrunning("pods", "cluster", "WATCH", 5)
    + longrunning("pods", "namespace", "WATCH", 2)
    + longrunning("pods", "resource", "CONNECT", 1, subresource="exec")
    + longrunning("pods", "resource", "WATCH", 3, subresource="log")
    + longrunning("gatesignals", "cluster", "WATCH", 1, group="pilotfish.io")
    + "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
    "# TYPE process_resident_memory_bytes gauge\n"
    "process_resident_memory_bytes 1.2e+08\n"
)

OLD_METRICS = """\
# HELP apiserver_registered_watchers [ALPHA] Number of currently registered watchers
# TYPE apiserver_registered_watchers gauge
apiserver_registered_watchers{group="",kind="Pod",version="v1"} 4
apiserver_registered_watchers{group="apps",kind="ReplicaSet",version="v1"} 2
"""


def test_watches_per_resource_sum_the_scopes_of_watches_only() -> None:
    # Cluster and namespace scopes are both pod watches; a CONNECT and a subresource are not.
    assert apiserver_watches(METRICS) == {"pods": 7, "pilotfish.io/gatesignals": 1}


def test_watches_fall_back_to_registered_watchers_by_kind() -> None:
    assert apiserver_watches(OLD_METRICS) == {"Pod": 4, "apps/ReplicaSet": 2}


def test_watch_delta_keeps_changes_only() -> None:
    before = {"pods": 5, "nodes": 3, "services": 1}
    after = {"pods": 7, "nodes": 3, "leases": 1}
    assert watch_delta(before, after) == {"leases": 1, "pods": 2, "services": -1}


def event(
    stage: str,
    verb: str,
    uri: str,
    *,
    audit_id: str = "a",
    at: datetime = T0,
    resource: str = "pods",
    group: str = "",
    namespace: str = "",
    agent: str = "OpenAPI-Generator/31.0.0/python",
    user: str = OPERATOR_USER,
) -> dict[str, Any]:
    ref = {"resource": resource, "apiVersion": "v1"}
    if group:
        ref["apiGroup"] = group
    if namespace:
        ref["namespace"] = namespace
    return {
        "auditID": audit_id,
        "stage": stage,
        "verb": verb,
        "requestURI": uri,
        "user": {"username": user},
        "userAgent": agent,
        "objectRef": ref,
        "requestReceivedTimestamp": at.isoformat().replace("+00:00", "Z"),
        "stageTimestamp": (at + timedelta(milliseconds=5)).isoformat().replace("+00:00", "Z"),
    }


def test_watch_key_decodes_selectors_and_ignores_paging_and_versions() -> None:
    e = event(
        "ResponseStarted",
        "watch",
        "/api/v1/namespaces/ns/pods?labelSelector=gates.pilotfish.io%2Fgated%3Dtrue"
        "&fieldSelector=status.phase%21%3DSucceeded&resourceVersion=42&watch=true",
        namespace="ns",
    )
    assert watch_key(e) == WatchKey(
        "pods", "ns", "gates.pilotfish.io/gated=true", "status.phase!=Succeeded"
    )
    listed = event("ResponseComplete", "list", "/api/v1/pods?limit=500&continue=abc")
    assert watch_key(listed) == WatchKey("pods")
    crd = event("ResponseStarted", "watch", "/apis/pilotfish.io/v1alpha1/gatesignals?watch=1")
    crd["objectRef"] = {"resource": "gatesignals", "apiGroup": "pilotfish.io"}
    assert watch_key(crd) == WatchKey("pilotfish.io/gatesignals")


def watch(stage: str, audit_id: str, uri: str = "/api/v1/pods?watch=1", **kw: Any) -> Any:
    return event(stage, "watch", uri, audit_id=audit_id, **kw)


def test_ledger_counts_open_watches_of_this_process_by_client() -> None:
    ledger = Ledger(since=T0)
    later = T0 + timedelta(seconds=1)
    for e in [
        # Before this process started: a dead process's watch, not counted.
        watch("ResponseStarted", "old", at=T0 - timedelta(seconds=1)),
        # Another user's watch of the same view: not this process.
        watch("ResponseStarted", "k", at=later, user="system:node:kwok"),
        watch("ResponseStarted", "w1", at=later),
        watch("ResponseStarted", "w2", at=later),
        watch("ResponseComplete", "w2", at=later),
        watch("ResponseStarted", "k1", "/api/v1/nodes?watch=1", resource="nodes", agent=KOPF),
    ]:
        ledger.feed(e)
    assert dict(ledger.watches()) == {
        (WatchKey("pods"), "runtime"): 1,
        (WatchKey("nodes"), "kopf"): 1,
    }
    assert watch_table(ledger.watches()) == [
        {"resource": "nodes", "client": "kopf", "watches": 1},
        {"resource": "pods", "client": "runtime", "watches": 1},
    ]


def test_a_second_watch_of_one_view_counts_twice_whichever_client_holds_it() -> None:
    ledger = Ledger(since=T0)
    nodes = "/api/v1/nodes?watch=1"
    ledger.feed(watch("ResponseStarted", "1", nodes, resource="nodes"))
    ledger.feed(watch("ResponseStarted", "2", nodes, resource="nodes", agent=KOPF))
    ledger.feed(watch("ResponseStarted", "3"))
    assert most_watches_per_key(ledger.watches()) == 2
    assert several_watches(ledger.watches()) == [
        {"resource": "nodes", "watches": {"runtime": 1, "kopf": 1}}
    ]
    # Another selector is another view: one watch each.
    ledger.feed(watch("ResponseComplete", "2", nodes, resource="nodes"))
    ledger.feed(watch("ResponseStarted", "4", "/api/v1/pods?labelSelector=a&watch=1"))
    assert most_watches_per_key(ledger.watches()) == 1
    assert most_watches_per_key(Ledger(since=T0).watches()) == 0


def test_a_view_is_synced_once_a_watch_opened_after_its_last_list() -> None:
    ledger = Ledger(since=T0)
    t = [T0 + timedelta(seconds=s) for s in range(6)]
    ledger.feed(event("ResponseComplete", "list", "/api/v1/pods?limit=500", at=t[1]))
    assert ledger.unwatched() == [WatchKey("pods")]
    ledger.feed(watch("ResponseStarted", "w", at=t[2]))
    assert ledger.unwatched() == []
    assert ledger.quiet_for(t[5]) == 3.0
    # The watch failed (410 Gone) and the informer relists: not synced until it watches again.
    ledger.feed(watch("ResponseComplete", "w", at=t[2]))
    ledger.feed(event("ResponseComplete", "list", "/api/v1/pods?limit=500", at=t[3]))
    assert ledger.unwatched() == [WatchKey("pods")]
    ledger.feed(watch("ResponseStarted", "v", at=t[4]))
    assert ledger.unwatched() == []


def test_a_process_that_lists_nothing_is_quiet_since_it_started() -> None:
    assert Ledger(since=T0).quiet_for(T0 + timedelta(seconds=7)) == 7.0


def test_proc_memory_reads_rss_and_peak_in_mb() -> None:
    status = "Name:\tpython\nVmPeak:\t 900000 kB\nVmHWM:\t  307200 kB\nVmRSS:\t  204800 kB\n"
    assert proc_memory(status) == {"VmHWM": 300.0, "VmRSS": 200.0}


def test_audit_tail_follows_rotation_and_waits_for_half_written_lines(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    one, two, three = ({"auditID": str(i)} for i in range(3))
    log.write_text(json.dumps(one) + "\n" + json.dumps(two)[:5])
    tail = AuditTail(log)
    assert list(tail.events()) == [one]
    with log.open("a") as f:
        f.write(json.dumps(two)[5:] + "\n")
    log.rename(tmp_path / "audit-2026-12-01T12-00-00.000.log")  # rotated, then a new file
    log.write_text(json.dumps(three) + "\n")
    assert list(tail.events()) == [two, three]
    assert list(tail.events()) == []


def measured(
    rss: float,
    most: int = 1,
    several: list[dict[str, Any]] | None = None,
    kopf_resource: str = "pods",
) -> Any:
    return {
        "vmrss_mb": rss,
        "vmhwm_mb": rss + 10,
        "process_resident_memory_mb": rss,
        "watches": [
            {"resource": "pods", "client": "runtime", "watches": 1},
            {"resource": kopf_resource, "client": "kopf", "watches": 1},
        ],
        "most_watches_per_resource_and_selector": most,
        "views_with_several_watches": several or [],
    }


def test_summary_judges_the_larger_after_and_any_doubled_view() -> None:
    doubled = [{"resource": "pods", "watches": {"runtime": 1, "kopf": 1}}]
    raw = {
        "idle": measured(100.0),
        "after_watching": measured(350.0),  # the operator that saw the pods arrive grew more
        "after_fresh_start": measured(250.0, most=2, several=doubled),
        "no_hot_path_controllers": measured(120.0),
        "kopf_import_mb": 19.0,
        "pods": 10_000,
    }
    s = summary(raw)
    assert s["rss_after_mb"] == 350.0
    assert s["per_pod_kb"] == round(250 * 1024 / 10_000, 2)
    assert s["met"] == {
        "rss": False,
        "one_watch_per_resource_and_selector": False,
        "kopf_watches_only_nodemaintenances": False,  # kopf held a pod watch
    }
    assert s["views_with_several_watches"] == doubled
    assert s["kopf"] == {"watches_in_full_operator": 1, "resources": ["pods"], "import_mb": 19.0}
    assert s["no_controllers_vmrss_mb"] == 120.0
    raw["after_watching"] = measured(240.0)
    raw["after_fresh_start"] = measured(250.0, kopf_resource="pilotfish.io/nodemaintenances")
    s = summary(raw)
    assert s["met"] == {
        "rss": True,
        "one_watch_per_resource_and_selector": True,
        "kopf_watches_only_nodemaintenances": True,
    }


def test_summary_fails_a_process_with_no_watch_at_all() -> None:
    raw = {k: measured(100.0, most=0) for k in ("idle", "after_watching", "after_fresh_start")}
    s = summary(
        {**raw, "no_hot_path_controllers": measured(90.0), "kopf_import_mb": 19.0, "pods": 1}
    )
    assert s["met"]["one_watch_per_resource_and_selector"] is False
