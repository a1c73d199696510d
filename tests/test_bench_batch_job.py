"""batch_job's bookkeeping: API writes per writer from audit lines, and the same work twice."""

from __future__ import annotations

import argparse
import json
from typing import Any

from benchmarks.batch_job import Stall, condition, owner, summary
from benchmarks.probes.writes import (
    BATCH_OPERATOR,
    JOB_CONTROLLER,
    KWOK,
    OPERATOR,
    SCHEDULER,
    by_role,
    count_writes,
    per_task,
)
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.stages import ANNOTATION_RUN_SECONDS


def _line(
    user: str,
    verb: str,
    resource: str = "pods",
    sub: str | None = None,
    namespace: str = "batch-job",
    stage: str = "ResponseComplete",
    impersonated: str | None = None,
    code: int = 201,
) -> str:
    ref: dict[str, Any] = {"resource": resource, "namespace": namespace, "name": "t-0"}
    if sub:
        ref["subresource"] = sub
    event: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "stage": stage,
        "verb": verb,
        "user": {"username": user},
        "objectRef": ref,
        "responseStatus": {"code": code},
    }
    if impersonated:
        event["impersonatedUser"] = {"username": impersonated}
    return json.dumps(event)


SAMPLE = [
    _line(JOB_CONTROLLER, "create"),
    _line(JOB_CONTROLLER, "create", stage="ResponseStarted"),  # not a second request
    _line(JOB_CONTROLLER, "patch"),  # the tracking finalizer removed
    _line(JOB_CONTROLLER, "update", resource="jobs", sub="status"),
    _line(JOB_CONTROLLER, "create", code=409),  # refused, still a request
    _line(SCHEDULER, "create", sub="binding"),
    _line(KWOK, "patch", sub="status"),
    _line(KWOK, "patch", sub="status"),
    _line(KWOK, "get", sub="status"),  # a read
    _line(JOB_CONTROLLER, "create", namespace="batch-bw"),  # another phase's
    _line(OPERATOR, "create", namespace="batch-bw", impersonated=BATCH_OPERATOR),
    _line(OPERATOR, "patch", namespace="batch-bw"),
    _line("pilotfish-admin", "create", resource="jobs"),
]


def test_writes_are_counted_per_writer_and_per_what_in_one_namespace() -> None:
    counts = count_writes(map(json.loads, SAMPLE), "batch-job")
    assert counts[JOB_CONTROLLER] == {
        "pods create": 2,
        "pods patch": 1,
        "jobs/status update": 1,
    }
    assert counts[SCHEDULER] == {"pods/binding create": 1}
    assert counts[KWOK] == {"pods/status patch": 2}
    assert counts["pilotfish-admin"] == {"jobs create": 1}
    assert set(counts) == {JOB_CONTROLLER, SCHEDULER, KWOK, "pilotfish-admin"}


def test_impersonated_writes_belong_to_the_impersonated_user() -> None:
    counts = count_writes(map(json.loads, SAMPLE), "batch-bw")
    assert counts[BATCH_OPERATOR] == {"pods create": 1}
    assert counts[OPERATOR] == {"pods patch": 1}
    assert counts[JOB_CONTROLLER] == {"pods create": 1}
    roles = by_role(counts)
    assert roles["batch_operator"] == 2 and roles["job_controller"] == 1


def test_per_task_divides_each_role_and_the_total() -> None:
    counts = count_writes(map(json.loads, SAMPLE), "batch-job")
    out = per_task(counts, tasks=2)
    assert out["job_controller"] == 2.0  # 4 writes for 2 tasks
    assert out["kwok"] == 1.0 and out["scheduler"] == 0.5
    assert out["other"] == 0.5  # the admin's create of the Job
    assert out["total"] == 4.0


def _args(**over: Any) -> argparse.Namespace:
    base = {"tasks": 200, "parallelism": 50, "run_seconds": 5.0, "order": "job-first"}
    return argparse.Namespace(**{**base, **over})


def test_both_owners_carry_the_same_work() -> None:
    (_, job), (bw_path, bw) = owner("job", _args()), owner("batchworkload", _args())
    assert job["spec"]["template"] == bw["spec"]["template"]
    assert job["spec"]["completionMode"] == "Indexed"
    for key in ("completions", "parallelism"):
        assert job["spec"][key] == bw["spec"][key]
    assert bw["spec"]["band"] == "batch" and bw["spec"]["team"]
    assert bw_path.endswith("/namespaces/batch-bw/batchworkloads")
    assert job["spec"]["template"]["metadata"]["annotations"] == {ANNOTATION_RUN_SECONDS: "5"}


def test_ratio_needs_both_phases_and_meets_only_both_targets() -> None:
    spec = ClusterSpec(nodes=20)
    job = {"completion_s": 40.0, "writes_per_task": {"job_controller": 2.0}}
    bw_ok = {"completion_s": 36.0, "writes_per_task": {"batch_operator": 2.5}}
    bw_chatty = {"completion_s": 36.0, "writes_per_task": {"batch_operator": 3.5}}
    ok = summary({"job": job, "batchworkload": bw_ok}, _args(), spec)
    assert ok["ratios"]["completion_batchworkload_over_job"] == 0.9 and ok["met"] is True
    assert summary({"job": job, "batchworkload": bw_chatty}, _args(), spec)["met"] is False
    failed = summary({"job": job, "batchworkload": {"error": "TimeoutError: ..."}}, _args(), spec)
    assert failed["ratios"]["completion_batchworkload_over_job"] is None
    assert failed["met"] is False


def test_condition_is_found_only_when_true() -> None:
    obj = {"status": {"conditions": [{"type": "Complete", "status": "False"}]}}
    assert condition(obj, "Complete") is None
    obj["status"]["conditions"][0]["status"] = "True"
    assert condition(obj, "Complete") == {"type": "Complete", "status": "True"}


def test_a_phase_stalls_only_after_the_limit_without_change() -> None:
    stall = Stall(60.0, now=0.0)
    assert not stall.stalled((None, None, None, 0), now=0.5)  # the first look is a change
    assert not stall.stalled((None, None, None, 0), now=60.0)
    assert stall.stalled((None, None, None, 0), now=60.6)
    assert not stall.stalled((1, 0, 0, 3), now=61.0)  # moved again: a fresh minute
    assert not stall.stalled((1, 0, 0, 3), now=120.0)
    assert stall.stalled((1, 0, 0, 3), now=121.5)
