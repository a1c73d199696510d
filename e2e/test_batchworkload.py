"""BatchWorkloads against the real control plane: a 200-task job, gangs, suspend and resume,
garbage collection, refused specs, `kubectl get bw` and tenant isolation.

Every job is created by the namespace's tenant, as a team would submit it; the operator makes
the pods (as its batch account), the real scheduler binds them to kwok nodes and kwok runs
them. The templates ask kwok to keep every task running (`batch.HELD`): the test ends each
one, as the kubelet would report it (`batch.Tasks`), so it chooses which index fails, when,
and how (kwok's own end of a task would race the test's: at its run's end kwok reports
Succeeded even over a Failed the test wrote). Each job's pods are followed by one watch
from before the job exists (`e2e.taskwatch.TaskWatch`): outcomes are counted and "never two pods on
one index" is checked on every state the API server went through, not on samples.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e import batch, taskwatch
from e2e.batch import Outcome, job, pods_left
from e2e.conftest import Env, Tenant, team_namespace, tenant_of, wait_until
from e2e.teams import own_team
from pilotfish import gates, names
from pilotfish.operators.gates import audit
from pilotfish.workloads import (
    ENV_COMPLETION_INDEX,
    ENV_TASK_INDEX,
    FINALIZER_TASK,
)

TEAM = "e2e"  # the namespace fixture's team, granted every band without limits


def check_task_pod(pod: dict[str, Any], bw: dict[str, Any]) -> list[str]:
    """What is wrong with a task pod as first created, per the task pod contract."""
    name, meta = bw["metadata"]["name"], pod["metadata"]
    index, attempt = taskwatch.index_of(pod), taskwatch.attempt_of(pod)
    problems = []
    if meta["name"] != f"{name}-{index}-{attempt}":
        problems.append(f"name {meta['name']} is not {name}-{index}-{attempt}")
    labels = meta.get("labels") or {}
    team_band = (labels.get(names.LABEL_TEAM), labels.get(names.LABEL_BAND))
    if team_band != (bw["spec"]["team"], bw["spec"]["band"]):
        problems.append(f"{meta['name']} team/band labels {labels}")
    owners = [
        (o["kind"], o["uid"], o.get("blockOwnerDeletion"))
        for o in meta.get("ownerReferences") or []
        if o.get("controller")
    ]
    if owners != [("BatchWorkload", bw["metadata"]["uid"], True)]:
        problems.append(f"{meta['name']} controller owner {owners}")
    if FINALIZER_TASK not in (meta.get("finalizers") or []):
        problems.append(f"{meta['name']} created without {FINALIZER_TASK}")
    for c in pod["spec"]["containers"]:
        env_vars = {e["name"]: e.get("value") for e in c.get("env") or []}
        for var in (ENV_TASK_INDEX, ENV_COMPLETION_INDEX):
            if env_vars.get(var) != str(index):
                problems.append(f"{meta['name']} container {c['name']} {var}={env_vars.get(var)}")
    return problems


# --- a job runs to completion ---------------------------------------------------------------

BIG = 200
PARALLELISM = 40
# Indexes whose first attempt does not succeed, while the other 197 run: failures and a
# preemption in the middle of the run, for the one-pod-per-index check to see replacements.
FIRST_ATTEMPT: dict[int, Outcome] = {17: "fail", 101: "fail", 150: "preempt"}


def test_200_tasks_complete_each_index_once_and_never_two_pods_on_one_index(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    def outcome(index: int, attempt: int) -> Outcome:
        return FIRST_ATTEMPT.get(index, "succeed") if attempt == 0 else "succeed"

    body = batch.batchworkload("big", TEAM, BIG, PARALLELISM)
    with job(env, tenant, body, outcome) as (watch, _):
        bw = batch.wait_condition(env.api, namespace, "big", "Complete", timeout=300)
        wait_until("the finished pods deleted", lambda: not pods_left(env, namespace, "big"))

    st = batch.status(bw)
    assert batch.condition(bw, "Complete")["reason"] == "Completed"
    assert batch.condition(bw, "Failed").get("status") in (None, "False")
    assert (st["succeeded"], st["completedIndexes"], st.get("active", 0)) == (200, "0-199", 0)
    assert (st["failed"], st.get("disrupted"), st.get("waiting", 0)) == (2, 1, 0), st
    assert st["observedGeneration"] == bw["metadata"]["generation"]
    assert st.get("startTime") and st.get("completionTime")

    assert watch.violations == [], watch.violations[:5]
    assert watch.gaps == 0, "the watch lost events: the counts below would not be exact"
    succeeded = watch.outcomes("Succeeded")
    wrong = {i: watch.history(i) for i in range(BIG) if succeeded[i] != 1}
    assert not wrong, f"indexes not succeeded exactly once: {wrong}"
    assert watch.outcomes("Failed") == Counter(dict.fromkeys(FIRST_ATTEMPT, 1))
    assert watch.peak <= PARALLELISM, f"{watch.peak} live pods at once"
    for index in FIRST_ATTEMPT:
        attempts = [taskwatch.attempt_of(p) for p in watch.of_index(index)]
        assert attempts == [0, 1], f"index {index}: {watch.history(index)}"
    first_states: dict[str, dict[str, Any]] = {}
    for s in watch.events():
        first_states.setdefault(s.uid, s.pod)
    problems = [msg for p in first_states.values() for msg in check_task_pod(p, bw)]
    assert problems == [], problems[:5]
    assert len(first_states) == BIG + len(FIRST_ATTEMPT)


# --- gang -----------------------------------------------------------------------------------

GANG = 8


def batch_pods_quota(env: Env, team: str, namespace: str, pods: int) -> None:
    """Give `team` room for `pods` batch pods (and nothing else), once admission sees it."""
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": team},
        "spec": {"team": team, "bands": {"batch": {"pods": pods}}},
    }
    k8s.CustomObjectsApi(env.api).create_cluster_custom_object(
        names.GROUP, names.VERSION, "teamquotas", body
    )
    probe = {
        "metadata": {"name": "probe", "labels": {names.LABEL_BAND: "batch"}},
        "spec": {"containers": [{"name": "c", "image": "example/probe:1"}]},
    }

    def seen() -> bool:
        try:
            k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as e:
            return "no batch quota" not in str(json.loads(e.body).get("message"))
        return True

    wait_until(f"TeamQuota {team} visible to admission", seen, timeout=30)


def gang_state(env: Env, ns: str, pod: str) -> dict[str, Any]:
    p = k8s.CoreV1Api(env.api).read_namespaced_pod(pod, ns)
    for c in p.status.conditions or []:
        if c.type == gates.POD_CONDITION:
            return {"reason": c.reason, "message": c.message or ""}
    return {}


def test_a_gang_of_8_is_released_together_or_not_at_all(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    with own_team(env, namespace) as team:
        batch_pods_quota(env, team, namespace, GANG - 1)
        body = batch.batchworkload("gang", team, GANG, GANG, gang=GANG)
        with job(env, tenant, body) as (watch, _):

            def all_held() -> list[dict[str, Any]] | None:
                pods = watch.live_pods()
                held = [p for p in pods if gates.GANG_GATE in gates.scheduling_gates(p)]
                return pods if len(pods) == GANG and len(held) == GANG else None

            pods = wait_until(f"{GANG} pods behind the gang gate", all_held, timeout=60)
            assert sorted(taskwatch.index_of(p) for p in pods) == list(range(GANG))
            for p in pods:
                assert p["metadata"]["labels"].get(gates.LABEL_GANG) == "gang"
            # The gate controller has looked at the whole gang and holds it, saying why.
            for p in pods:
                pod_name = p["metadata"]["name"]

                def held_for_room(pod_name: str = pod_name) -> bool:
                    s = gang_state(env, namespace, pod_name)
                    says = s.get("message", "")
                    return s.get("reason") == gates.STATE_GATED and (
                        "quota" in says or f"{GANG}/{GANG} pods present" in says
                    )

                wait_until(f"{pod_name} held for the gang's quota", held_for_room, timeout=60)
            assert all(
                gates.GANG_GATE in gates.scheduling_gates(p) and not p["spec"].get("nodeName")
                for p in watch.pods()
            ), "a gang pod was released with room for only 7"

            room_at = len(watch.events())
            k8s.CustomObjectsApi(env.api).patch_cluster_custom_object(
                names.GROUP,
                names.VERSION,
                "teamquotas",
                team,
                {"spec": {"bands": {"batch": {"pods": GANG}}}},
            )
            batch.wait_condition(env.api, namespace, "gang", "Complete", timeout=120)

        events = watch.events()
        ungated = {
            s.uid: s.seq
            for s in reversed(events)
            if gates.GANG_GATE not in gates.scheduling_gates(s.pod)
        }
        bound = {s.uid: s.seq for s in reversed(events) if s.pod["spec"].get("nodeName")}
        gang_uids = {s.uid for s in events if s.pod["metadata"]["labels"].get(gates.LABEL_GANG)}
        assert len(gang_uids) == GANG
        assert all(ungated[u] >= room_at for u in gang_uids), "released before there was room"
        if env.layout is not None:
            lines = [
                r
                for r in audit.read(env.layout.logs / "gates-audit.jsonl")
                if r["uid"] in gang_uids and r["gate"] == gates.GANG_GATE
            ]
            assert len(lines) == GANG, lines
            assert len({r["ts"] for r in lines}) == 1, f"one release for the gang: {lines}"
        else:  # no audit log to read: the gate left all of them before any was placed
            assert max(ungated[u] for u in gang_uids) < min(bound[u] for u in gang_uids)


# --- suspend --------------------------------------------------------------------------------


def test_suspend_stops_creation_and_removes_active_pods_and_resume_completes(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    ending = {"on": False}  # tasks run until the test lets them end

    def outcome(index: int, attempt: int) -> Outcome | None:
        return "succeed" if ending["on"] else None

    body = batch.batchworkload("pausing", TEAM, 6, 2)
    with job(env, tenant, body, outcome) as (watch, tasks):
        wait_until(
            "2 tasks running",
            lambda: len([p for p in watch.live_pods() if taskwatch.running(p)]) == 2,
        )
        tenant.kubectl("patch", "bw", "pausing", "--type=merge", "-p", '{"spec":{"suspend":true}}')
        bw = batch.wait_condition(env.api, namespace, "pausing", "Suspended", reason="Suspended")
        suspended_at = len(watch.events())
        wait_until("the active pods removed", lambda: not watch.live_pods(), timeout=60)
        wait_until(
            "status active 0 while suspended",
            lambda: batch.status(batch.get(env.api, namespace, "pausing")).get("active") == 0,
        )
        bw = batch.get(env.api, namespace, "pausing")
        assert batch.status(bw)["observedGeneration"] == bw["metadata"]["generation"]
        made = [s.name for s in watch.events()[suspended_at:] if s.type == "ADDED"]
        assert made == [], f"pods created while suspended: {made}"

        ending["on"] = True
        tasks.rescan()
        tenant.kubectl("patch", "bw", "pausing", "--type=merge", "-p", '{"spec":{"suspend":false}}')
        batch.wait_condition(env.api, namespace, "pausing", "Suspended", "False", "Resumed")
        bw = batch.wait_condition(env.api, namespace, "pausing", "Complete", reason="Completed")

    st = batch.status(bw)
    assert (st["succeeded"], st["completedIndexes"], st["failed"]) == (6, "0-5", 0), st
    assert watch.outcomes("Succeeded") == Counter(dict.fromkeys(range(6), 1))
    assert watch.violations == []
    assert watch.peak <= 2


# --- garbage collection ---------------------------------------------------------------------


def test_a_deleted_jobs_pods_are_garbage_collected(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    body = batch.batchworkload("doomed", TEAM, 10, 4)
    with job(env, tenant, body, lambda i, a: None) as (watch, _):
        wait_until(
            "4 tasks running",
            lambda: len([p for p in watch.live_pods() if taskwatch.running(p)]) == 4,
        )
        tenant.kubectl("delete", "bw", "doomed", "--wait=false")
        wait_until(
            "no pod of the deleted job left",
            lambda: not pods_left(env, namespace, "doomed"),
            timeout=90,
        )
        made = [s for s in watch.events() if s.type == "ADDED"]
        assert len(made) == 4, f"pods created for a job being deleted: {[s.name for s in made]}"


# --- refused and accepted specs -------------------------------------------------------------

REFUSED = [
    ({"completions": -1}, "spec.completions"),
    ({"completions": 0}, "spec.completions"),
    ({"parallelism": -2}, "spec.parallelism"),
    ({"backoffLimit": -1}, "spec.backoffLimit"),
    ({"backoffLimitPerIndex": -1}, "spec.backoffLimitPerIndex"),
    ({"completions": 3, "parallelism": 4, "gang": 4}, "spec.gang"),
]


@pytest.mark.parametrize(("spec", "field"), REFUSED, ids=[f for _, f in REFUSED])
def test_invalid_specs_are_refused_naming_the_field(
    tenant: Tenant, spec: dict[str, Any], field: str
) -> None:
    body = batch.batchworkload("bad", TEAM, 3, 2)
    body["spec"].update(spec)
    res = tenant.kubectl("create", "-f", "-", "-o", "name", check=False, input=json.dumps(body))
    assert res.returncode != 0, f"{spec} was accepted"
    assert field in res.stderr, res.stderr
    value = str(next(v for k, v in spec.items() if field.endswith(k)))
    assert value in res.stderr or field == "spec.gang", f"the value is not named: {res.stderr}"
    assert "Internal error" not in res.stderr


def printed(tenant: Tenant, name: str) -> dict[str, str]:
    """`kubectl get bw NAME -o wide` as a mapping of column to cell."""
    out = tenant.kubectl("get", "bw", name, "-o", "wide").stdout.splitlines()
    header = out[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    cells = [
        out[1][a:b].strip() for a, b in zip(starts, [*starts[1:], len(out[1]) + 1], strict=True)
    ]
    return dict(zip(header.split(), cells, strict=True))


def cell(obj: dict[str, Any], path: str) -> str | None:
    """What kubectl prints for a printer column's JSONPath; None for paths not read here."""
    if path == '.status.conditions[?(@.status=="True")].type':
        conds = batch.status(obj).get("conditions") or []
        return ",".join(c["type"] for c in conds if c.get("status") == "True")
    if "[" in path:
        return None
    value: Any = obj
    for key in path.strip(".").split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def check_columns(env: Env, row: dict[str, str], bw: dict[str, Any]) -> None:
    """Every printer column the CRD declares is printed, as the object says."""
    crd = k8s.ApiextensionsV1Api(env.api).read_custom_resource_definition(
        f"{batch.PLURAL}.{names.GROUP}"
    )
    version = next(v for v in crd.spec.versions if v.name == names.VERSION)
    for col in version.additional_printer_columns or []:
        header = col.name.upper()
        assert header in row, f"column {col.name} not printed: {row}"
        want = cell(bw, col.json_path)
        if want is not None and col.type in ("integer", "string"):
            assert row[header] in ((want,) if want else ("", "<none>")), (col.name, row, want)


def test_parallelism_above_completions_is_accepted_and_get_bw_shows_progress(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    ending = {"on": False}

    def outcome(index: int, attempt: int) -> Outcome | None:
        return "succeed" if ending["on"] or index == 0 else None

    body = batch.batchworkload("wide", TEAM, 3, 5)
    with job(env, tenant, body, outcome) as (watch, tasks):

        def progress() -> dict[str, str] | None:
            row = printed(tenant, "wide")
            return row if (row.get("SUCCEEDED"), row.get("ACTIVE")) == ("1", "2") else None

        row = wait_until("get bw showing 1 succeeded and 2 active", progress, timeout=60)
        assert (row["NAME"], row["TEAM"], row["COMPLETIONS"]) == ("wide", TEAM, "3"), row
        assert row.get("FAILED") == "0", row
        ending["on"] = True
        tasks.rescan()
        batch.wait_condition(env.api, namespace, "wide", "Complete")

        def finished() -> dict[str, str] | None:
            row = printed(tenant, "wide")
            return row if row.get("SUCCEEDED") == "3" else None

        row = wait_until("get bw showing completion", finished)
        check_columns(env, row, batch.get(env.api, namespace, "wide"))
        assert row.get("ACTIVE") == "0", row
    assert watch.peak <= 3, "never more pods than tasks"


# --- tenancy --------------------------------------------------------------------------------


@pytest.fixture
def stranger(env: Env, namespace: str) -> Iterator[Tenant]:
    """The tenant of another namespace."""
    with team_namespace(env, f"{namespace[:50]}-other", TEAM) as other:
        yield tenant_of(env, other)


def test_a_tenant_of_another_namespace_can_neither_read_nor_write_the_job(
    env: Env, namespace: str, tenant: Tenant, stranger: Tenant
) -> None:
    with job(env, tenant, batch.batchworkload("mine", TEAM, 1, 1)):
        batch.wait_condition(env.api, namespace, "mine", "Complete")
    for args in (
        ("get", "bw", "mine"),
        ("patch", "bw", "mine", "--type=merge", "-p", '{"spec":{"suspend":true}}'),
        ("delete", "bw", "mine"),
    ):
        res = stranger.kubectl(*args, "-n", namespace, check=False)
        assert res.returncode != 0 and "forbidden" in res.stderr.lower(), (args, res.stderr)
    with pytest.raises(ApiException) as err:
        k8s.CustomObjectsApi(stranger.api).patch_namespaced_custom_object_status(
            names.GROUP,
            names.VERSION,
            namespace,
            batch.PLURAL,
            "mine",
            {"status": {"succeeded": 1}},
        )
    assert err.value.status == 403
    assert batch.get(env.api, namespace, "mine")["spec"].get("suspend") in (None, False)
