"""At most three API writes per task, and no finalizer held where no replacement can come:
recorded pods are deleted with one deletecollection a sync (never one whose outcome the
written status lacks), a namespace being deleted gets nothing created and every task pod
let go, a suspended job's failed pods are let go, and the backoff base is a setting."""

from __future__ import annotations

from typing import Any

import pytest

from pilotfish import podmeta
from pilotfish.indexranges import IndexSet
from pilotfish.kube.rest import NAMESPACES, PODS
from pilotfish.operators.batchworkload import decide as decide_module
from pilotfish.operators.batchworkload.controller import BACKOFF_ENV, backoff_from_env
from pilotfish.operators.batchworkload.model import LABEL_TASK_RECORDED
from pilotfish.timeutil import FakeClock
from pilotfish.workloads import ANNOTATION_TASK_FAILURES, FINALIZER_TASK
from tests.batch_harness import NS, Cluster, World, batch, index_of, start

Obj = dict[str, Any]
TERMINATING = {
    "kind": "Status",
    "reason": "Forbidden",
    "message": 'pods "job-0-0" is forbidden: unable to create new content in namespace ns '
    "because it is being terminated",
    "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
}


async def world(spec: Obj, **kw: float) -> World:
    return await start(Cluster(), FakeClock(), create=spec, **kw)


def guard_deletes(w: World) -> list[int]:
    """Before every deletecollection, check each pod it may delete is in the status."""
    checked: list[int] = []

    def check() -> None:
        status = w.api.status()
        done = IndexSet.parse(status.get("completedIndexes") or "")
        recorded = set(status.get("recordedPods") or [])
        for p in w.api.pods_of():
            if (p["metadata"].get("labels") or {}).get(LABEL_TASK_RECORDED) == "true":
                phase = p["status"].get("phase")
                ok = index_of(p) in done if phase == "Succeeded" else True
                if phase == "Failed":
                    ok = p["metadata"]["uid"] in recorded or index_of(p) in done
                assert ok, f"{p['metadata']['name']} deleted before its outcome was written"
                checked.append(index_of(p))

    for _ in range(1000):
        w.api.before("DELETE", f"/namespaces/{NS}/pods", check)
    return checked


async def test_at_most_three_writes_per_task_status_included() -> None:
    assert LABEL_TASK_RECORDED not in podmeta.KEYS
    assert not podmeta.is_pilotfish_key(LABEL_TASK_RECORDED)
    tasks = 20
    w = await world(batch(completions=tasks, parallelism=5, backoffLimit=10), backoff_base=0.0)
    checked = guard_deletes(w)
    try:
        failed_once = False
        for _ in range(40):
            await w.converge()
            if w.api.condition("Complete"):
                break
            for p in w.api.live():
                name = p["metadata"]["name"]
                w.api.bind(name)
                fail = not failed_once and index_of(p) == 3
                failed_once = failed_once or fail
                w.api.finish(name, "Failed" if fail else "Succeeded")
        assert w.api.condition("Complete") == ("True", "Completed")
        assert w.api.status()["failed"] == 1
        writes = [c for c in w.api.writes() if "/events" not in c.path]
        pods = tasks + 1  # one retry
        assert len(writes) <= 3 * pods, [(c.method, c.path) for c in writes]
        one_by_one = [c for c in writes if c.method == "DELETE" and not c.path.endswith("/pods")]
        assert one_by_one == []
        assert checked and w.api.pods_of() == []
    finally:
        await w.stop()


async def test_nothing_is_labelled_or_deleted_when_the_status_write_is_refused() -> None:
    w = await world(batch(completions=3, parallelism=3))
    try:
        await w.converge()
        w.api.run_all()
        w.api.fail_next("PATCH", "/status", 409)
        result = await w.step()
        assert result.retry
        assert len(w.api.tracked()) == 3
        assert not [c for c in w.api.writes("/pods") if c.method in ("PATCH", "DELETE")]
        await w.converge()
        assert w.api.status()["succeeded"] == 3 and w.api.pods_of() == []
    finally:
        await w.stop()


async def test_an_identity_without_deletecollection_deletes_one_by_one() -> None:
    w = await world(batch(completions=3, parallelism=3))
    try:
        await w.converge()
        w.api.run_all()
        w.api.fail_next("DELETE", f"/namespaces/{NS}/pods", 403)
        await w.converge()
        assert w.api.status()["succeeded"] == 3 and w.api.pods_of() == []
        one_by_one = [c for c in w.api.writes("/pods/") if c.method == "DELETE"]
        assert len(one_by_one) == 3
    finally:
        await w.stop()


async def test_a_namespace_being_deleted_gets_no_creates_and_every_pod_let_go() -> None:
    w = await world(batch(completions=4, parallelism=2, backoffLimit=5), backoff_base=100.0)
    try:
        await w.converge()
        w.api.bind("job-0-0")
        w.api.finish("job-0-0", "Failed")  # recorded, kept with its finalizer for the retry
        await w.converge()
        assert "job-0-0" in w.api.tracked()
        ns: Obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        w.api.put(NAMESPACES.path(name=NS), ns)
        ns["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        ns["status"] = {"phase": "Terminating"}
        w.api.put(NAMESPACES.path(name=NS), ns)
        before = len(w.api.creates())
        w.clock.advance(200)  # the backoff is over: a replacement would be due
        await w.converge()
        assert w.api.tracked() == []
        assert len(w.api.creates()) == before
    finally:
        await w.stop()


async def test_a_create_refused_as_terminating_stops_creates_and_lets_go() -> None:
    w = await world(batch(completions=4, parallelism=2, backoffLimit=5), backoff_base=0.0)
    try:
        await w.converge()
        w.api.run_all("Failed")
        w.api.fail_next("POST", "/pods", 403, body=TERMINATING)
        result = await w.step()
        assert not result.retry  # not an error to back off from: a fact
        before = len(w.api.creates())
        await w.converge()
        assert w.api.tracked() == []
        assert len(w.api.creates()) == before
        assert "FailedCreate" not in {e["reason"] for e in await w.events()}
    finally:
        await w.stop()


async def test_a_suspended_jobs_failed_pod_is_let_go_and_its_count_kept() -> None:
    w = await world(batch(completions=1, parallelism=1, backoffLimit=5), backoff_base=100.0)
    try:
        await w.converge()
        w.api.bind("job-0-0")
        w.api.finish("job-0-0", "Failed")
        await w.converge()  # recorded; kept with the finalizer while it backs off
        assert w.api.status()["failed"] == 1 and w.api.tracked() == ["job-0-0"]
        w.api.edit_spec(suspend=True)
        await w.converge()
        assert w.api.tracked() == []
        assert w.api.obj(PODS.path(NS, "job-0-0")) is not None  # kept: its failure count
        w.api.edit_spec(suspend=False)
        w.clock.advance(200)
        await w.converge()
        retry = w.api.obj(PODS.path(NS, "job-0-1"))
        assert retry is not None
        assert retry["metadata"]["annotations"][ANNOTATION_TASK_FAILURES] == "1"
        assert FINALIZER_TASK in retry["metadata"]["finalizers"]
        assert w.api.obj(PODS.path(NS, "job-0-0")) is None
    finally:
        await w.stop()


def test_the_backoff_base_is_an_operator_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert backoff_from_env({}) == 10.0
    assert backoff_from_env({BACKOFF_ENV: "0.5"}) == 0.5
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ValueError, match=f"{BACKOFF_ENV}='{bad}'"):
            backoff_from_env({BACKOFF_ENV: bad})


async def test_the_controller_reads_the_backoff_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from pilotfish.kube.runtime import Runtime
    from pilotfish.operators.batchworkload import BatchWorkloadController

    monkeypatch.setenv(BACKOFF_ENV, "2")
    rt = Runtime.build(Cluster(), clock=FakeClock(), resync_seconds=None)
    assert BatchWorkloadController(rt).backoff_base == 2.0
    assert BatchWorkloadController(rt, backoff_base=7.0).backoff_base == 7.0


def _collections(w: World, since: int = 0) -> list[Any]:
    return [c for c in w.api.calls[since:] if c.method == "DELETE" and c.path.endswith("/pods")]


async def test_recorded_pods_are_kept_then_terminal_ones_go_at_once_and_live_ones_gracefully() -> (
    None
):
    """A recorded pod is kept (untracked, labelled recorded) while the job runs, as a Job
    keeps its pods; when the job stops, one deletecollection takes the recorded terminal pods
    with grace 0 (nothing runs on their node; the kubelet's own final delete would be a write
    per task), and the running ones with their grace period, so their node stops them first."""
    w = await world(batch(completions=4, parallelism=2), backoff_base=0.0)
    try:
        await w.converge()
        first, second = sorted(p["metadata"]["name"] for p in w.api.live())
        w.api.bind(first)
        w.api.bind(second)
        w.api.finish(first)
        await w.converge()
        assert _collections(w) == [], "a recorded pod was deleted while the job runs"
        kept = w.api.obj(PODS.path(NS, first))
        assert kept is not None and kept["metadata"]["labels"][LABEL_TASK_RECORDED] == "true"
        assert w.api.status()["succeeded"] == 1
        before = len(w.api.calls)
        w.api.edit_spec(suspend=True)
        await w.converge()
        collections = _collections(w, before)
        forced = [c for c in collections if c.body == {"gracePeriodSeconds": 0}]
        assert forced and "status.phase!=Running" in forced[0].params["fieldSelector"]
        assert first not in {p["metadata"]["name"] for p in w.api.pods_of()}
        graceful = [c for c in collections if c.body is None]
        assert graceful, "a suspended job's running pod was not deleted gracefully"
        assert graceful[0].params["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed"
    finally:
        await w.stop()


async def test_a_long_job_collects_its_recorded_pods_in_batches_and_all_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decide_module, "RETAIN_RECORDED_PODS", 3)
    w = await world(batch(completions=8, parallelism=2), backoff_base=0.0)
    try:
        seen_most = 0
        for _ in range(8):
            await w.converge()
            w.api.run_all()
            kept = [p for p in w.api.pods_of() if p["status"].get("phase") == "Succeeded"]
            seen_most = max(seen_most, len(kept))
        await w.converge()
        assert w.api.condition("Complete") == ("True", "Completed")
        assert seen_most <= 3 + 2  # the bound, plus one sync's worth of newly recorded pods
        assert len(_collections(w)) >= 2  # batches while it ran, then the rest at its end
        assert w.api.pods_of() == []
    finally:
        await w.stop()


def test_a_template_cannot_set_the_keys_only_the_operator_sets() -> None:
    """The recorded label (what the deletecollection selects) and the gang's label and gate
    come from the operator alone, never from the template."""
    from pilotfish.gates import GANG_GATE, LABEL_GANG
    from pilotfish.operators.batchworkload.taskpod import task_pod

    bw = batch(completions=3, parallelism=3)
    bw["metadata"]["uid"] = "u1"
    template = bw["spec"]["template"]
    template.setdefault("metadata", {})["labels"] = {LABEL_TASK_RECORDED: "true", LABEL_GANG: "x"}
    template["spec"]["schedulingGates"] = [{"name": GANG_GATE}, {"name": "example.com/own"}]
    pod = task_pod(bw, 0, 0, 0, gang=False)
    assert LABEL_TASK_RECORDED not in pod["metadata"]["labels"]
    assert LABEL_GANG not in pod["metadata"]["labels"]
    assert pod["spec"]["schedulingGates"] == [{"name": "example.com/own"}]
    member = task_pod(bw, 0, 0, 0, gang=True)
    assert member["metadata"]["labels"][LABEL_GANG] == bw["metadata"]["name"]
    assert [g["name"] for g in member["spec"]["schedulingGates"]] == ["example.com/own", GANG_GATE]
