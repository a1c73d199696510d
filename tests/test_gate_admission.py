"""Gated release at admission, without a cluster: which pods get which gates, the JSON patch
that puts them on, the record the gate controller reads back, every denial's text, and the
refusal to admit pods before the GatePolicy view has synced.

Patches are applied with `jsonpatch` (RFC 6902, a dependency of kopf) to a pod dict, so a
wrong path, a missing parent or an unescaped `/` in a label key fails here as it would at
the API server.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pilotfish.api.base import LabelSelector
from pilotfish.gates import (
    ANNOTATION_CREATED,
    ANNOTATION_RECORD,
    LABEL_GATED,
    GateRecord,
    PodGates,
    read_record,
)
from pilotfish.kube.factory import InformerFactory
from pilotfish.tasks import TaskDied, run_guarded
from pilotfish.webhooks import gating, pods, server
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.gatecache import GATE_POLICIES, GatePolicyCache, StaticViews
from pilotfish.webhooks.gateview import BrokenPolicy, GateView, PolicyEntry, parse_policy
from pilotfish.webhooks.patches import escape, pointer
from pilotfish.webhooks.podchecks import POD_CHECKS, PodAdmission, PodCheck, violations
from tests import builders
from tests.fakeapi import FakeApi
from tests.test_chart_values import CHART, helm, needs_helm

Client = TestClient[web.Request, web.Application]

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
CREATED = "2030-01-02T03:04:05Z"
DATA_READY = "gates.pilotfish.io/data-ready"
QUOTA = "gates.pilotfish.io/quota"


def policy(
    name: str,
    namespace: str = "team-a",
    *,
    selector: dict[str, Any] | None = None,
    gates: list[dict[str, Any]] | None = None,
    prefixes: list[str] | None = None,
    generation: int = 1,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "web"}} if selector is None else selector,
        "gates": gates or [builders.gate()],
    }
    if prefixes is not None:
        spec["allowedPrefixes"] = prefixes
    obj = builders.obj("GatePolicy", spec)
    obj["metadata"] = {"name": name, "namespace": namespace, "generation": generation}
    return obj


def view(*policies: dict[str, Any]) -> GateView:
    return GateView.from_objects(policies)


def pod(
    labels: dict[str, str] | None = None,
    gates: list[str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "web-0", "namespace": "team-a"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    body: dict[str, Any] = {"containers": [{"name": "web", "image": "nginx"}], **spec}
    if gates is not None:
        body["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def request(obj: dict[str, Any], namespace: str = "team-a", operation: str = "CREATE") -> Any:
    return {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": obj,
    }


def applied(obj: dict[str, Any], decision: Decision) -> dict[str, Any]:
    assert decision.allowed, decision.message
    result: dict[str, Any] = jsonpatch.apply_patch(obj, list(decision.patch))
    return result


def mutated(obj: dict[str, Any], gate_view: GateView, namespace: str = "team-a") -> dict[str, Any]:
    return applied(obj, pods.mutate(request(obj, namespace), gate_view, NOW))


# --- selectors ---------------------------------------------------------------------------

SELECTOR_CASES = [
    ({}, {}, True),
    ({}, {"app": "web"}, True),
    ({"matchLabels": {"app": "web"}}, {"app": "web", "x": "y"}, True),
    ({"matchLabels": {"app": "web"}}, {"app": "db"}, False),
    ({"matchLabels": {"app": "web"}}, {}, False),
    ({"matchLabels": {"app": "web", "tier": "a"}}, {"app": "web"}, False),
    (
        {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "db"]}]},
        {"app": "db"},
        True,
    ),
    (
        {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]},
        {"app": "db"},
        False,
    ),
    ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}, {}, False),
    (
        {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]},
        {"app": "db"},
        True,
    ),
    (
        {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]},
        {"app": "web"},
        False,
    ),
    # NotIn holds for a pod without the key, as in Kubernetes.
    ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}, {}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"app": "web"}, False),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"app": "web"}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": "a"}, False),
    # matchLabels and every expression must all hold.
    (
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["batch"]},
                {"key": "canary", "operator": "DoesNotExist"},
            ],
        },
        {"app": "web", "tier": "batch"},
        True,
    ),
    (
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["batch"]},
                {"key": "canary", "operator": "DoesNotExist"},
            ],
        },
        {"app": "web", "tier": "batch", "canary": "1"},
        False,
    ),
]


@pytest.mark.parametrize(("selector", "labels", "selected"), SELECTOR_CASES)
def test_selector_matching(
    selector: dict[str, Any], labels: dict[str, str], selected: bool
) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is selected
    gate_view = view(policy("p", selector=selector))
    assert bool(gate_view.selecting("team-a", labels)) is selected
    # Selection is per namespace: the same policy never selects a pod of another namespace.
    assert gate_view.selecting("team-b", labels) == ()
    gated = mutated(pod(labels), gate_view)
    assert (DATA_READY in [g["name"] for g in gated["spec"].get("schedulingGates", [])]) is selected


# --- the patch -----------------------------------------------------------------------------


def test_a_selected_pod_gets_its_gates_label_and_record() -> None:
    gate_view = view(
        policy(
            "data",
            generation=3,
            gates=[
                builders.gate(DATA_READY, timeoutSeconds=600),
                builders.gate(
                    QUOTA,
                    condition={"type": "Quota"},
                    timeoutSeconds=60,
                    onExpiry="Retry",
                    retry={"initialBackoffSeconds": 5, "maxBackoffSeconds": 80},
                ),
            ],
        )
    )
    before = pod({"app": "web"})
    after = mutated(copy.deepcopy(before), gate_view)

    assert after["spec"]["schedulingGates"] == [{"name": DATA_READY}, {"name": QUOTA}]
    assert after["metadata"]["labels"] == {"app": "web", LABEL_GATED: "true"}
    assert after["metadata"]["annotations"][ANNOTATION_CREATED] == CREATED
    # Nothing else changed.
    assert after["spec"]["containers"] == before["spec"]["containers"]
    assert set(after["metadata"]) == {"name", "namespace", "labels", "annotations"}

    assert read_record(after) == PodGates(
        created=CREATED,
        gates={
            DATA_READY: GateRecord(
                policy="data",
                generation=3,
                condition={"type": "GateSignal", "signalName": "data-ready"},
                timeout_seconds=600,
                deadline="2030-01-02T03:14:05Z",
                on_expiry="Fail",
                initial_backoff_seconds=10,
                max_backoff_seconds=600,
                attempts=0,
                owner="pilotfish-operator",
            ),
            QUOTA: GateRecord(
                policy="data",
                generation=3,
                condition={"type": "Quota"},
                timeout_seconds=60,
                deadline="2030-01-02T03:05:05Z",
                on_expiry="Retry",
                initial_backoff_seconds=5,
                max_backoff_seconds=80,
                owner="pilotfish-operator",
            ),
        },
    )
    # The annotation is exactly PodGates.encode(): the contract's own serialisation.
    record = read_record(after)
    assert record is not None
    assert after["metadata"]["annotations"][ANNOTATION_RECORD] == record.encode()


# (labels, annotations, client gates) as the client sent them -> what must be after the patch
SHAPES: list[tuple[Any, Any, Any]] = [
    (None, None, None),  # nothing there: each map and the list is created
    ({"app": "web"}, {"team": "a"}, []),  # empty list: appended to, not replaced
    ({"app": "web"}, {"team": "a"}, ["example.com/own"]),  # the client's gate stays first
    ({"app": "web"}, {}, [DATA_READY]),  # the client set the policy's gate: not duplicated
    # A forged record and label are overwritten, not kept beside ours.
    ({"app": "web", LABEL_GATED: "no"}, {ANNOTATION_RECORD: "{}", ANNOTATION_CREATED: "x"}, None),
]


@pytest.mark.parametrize(("labels", "annotations", "gates"), SHAPES)
def test_patch_adds_to_whatever_shape_the_pod_has(
    labels: dict[str, str] | None, annotations: dict[str, str] | None, gates: list[str] | None
) -> None:
    # The policy selects every pod, so an absent labels map is selected too.
    gate_view = view(policy("all", selector={}))
    obj = pod(labels, gates, annotations)
    after = mutated(obj, gate_view)

    expected_gates = [*(gates or []), *([] if DATA_READY in (gates or []) else [DATA_READY])]
    assert [g["name"] for g in after["spec"]["schedulingGates"]] == expected_gates
    assert after["metadata"]["labels"] == {**(labels or {}), LABEL_GATED: "true"}
    kept = {k: v for k, v in (annotations or {}).items() if not k.startswith("gates.pilotfish.io/")}
    assert after["metadata"]["annotations"] == {
        **kept,
        ANNOTATION_CREATED: CREATED,
        ANNOTATION_RECORD: after["metadata"]["annotations"][ANNOTATION_RECORD],
    }
    record = read_record(after)
    assert record is not None and list(record.gates) == [DATA_READY]


def test_null_maps_are_replaced_not_indexed() -> None:
    obj = pod()
    obj["metadata"]["labels"] = None
    obj["metadata"]["annotations"] = None
    obj["spec"]["schedulingGates"] = None
    after = mutated(obj, view(policy("all", selector={})))
    assert after["metadata"]["labels"] == {LABEL_GATED: "true"}
    assert after["spec"]["schedulingGates"] == [{"name": DATA_READY}]


def test_gates_of_every_selecting_policy_in_name_order() -> None:
    gate_view = view(
        policy("b-second", gates=[builders.gate("gates.pilotfish.io/b")]),
        policy("a-first", gates=[builders.gate("gates.pilotfish.io/a")]),
        policy(
            "c-unselecting",
            selector={"matchLabels": {"app": "db"}},
            gates=[builders.gate("gates.pilotfish.io/c")],
        ),
        policy(
            "d-other-ns",
            namespace="team-b",
            selector={},
            gates=[builders.gate("gates.pilotfish.io/d")],
        ),
    )
    after = mutated(pod({"app": "web"}), gate_view)
    assert after["spec"]["schedulingGates"] == [
        {"name": "gates.pilotfish.io/a"},
        {"name": "gates.pilotfish.io/b"},
    ]
    record = read_record(after)
    assert record is not None
    assert {n: r.policy for n, r in record.gates.items()} == {
        "gates.pilotfish.io/a": "a-first",
        "gates.pilotfish.io/b": "b-second",
    }


def test_the_same_gate_from_two_policies_the_first_by_name_wins_with_a_warning() -> None:
    gate_view = view(
        policy("zeta", gates=[builders.gate(DATA_READY, timeoutSeconds=30)]),
        policy("alpha", gates=[builders.gate(DATA_READY, timeoutSeconds=900)]),
    )
    obj = pod({"app": "web"})
    decision = pods.mutate(request(obj), gate_view, NOW)
    after = applied(obj, decision)
    assert after["spec"]["schedulingGates"] == [{"name": DATA_READY}]
    record = read_record(after)
    assert record is not None
    assert record.gates[DATA_READY].policy == "alpha"
    assert record.gates[DATA_READY].timeout_seconds == 900
    assert decision.warnings == (
        f"gate {DATA_READY} is declared by GatePolicies alpha and zeta; "
        "the terms of alpha apply (the first by name wins)",
    )


@pytest.mark.parametrize(
    "obj",
    [
        pod({"app": "db"}),
        pod(None),
        pod({"app": "web-2"}),
    ],
)
def test_a_pod_no_policy_selects_is_not_patched(obj: dict[str, Any]) -> None:
    decision = pods.mutate(request(obj), view(policy("p")), NOW)
    assert decision == Decision.mutate(())
    assert decision.label == "allow"


def test_a_pod_in_a_namespace_without_policies_is_not_patched() -> None:
    decision = pods.mutate(request(pod({"app": "web"}), "team-b"), view(policy("p")), NOW)
    assert decision.patch == ()


def test_a_forged_record_on_an_ungated_pod_is_removed() -> None:
    obj = pod({"app": "db", LABEL_GATED: "true"}, annotations={ANNOTATION_RECORD: "{}", "x": "y"})
    after = mutated(obj, view(policy("p")))
    assert after["metadata"]["labels"] == {"app": "db"}
    assert after["metadata"]["annotations"] == {"x": "y"}


def test_a_tenant_pod_naming_its_node_is_refused_before_any_gate() -> None:
    obj = pod({"app": "web"}, nodeName="kwok-zone-a-0")
    for decision in (
        pods.mutate(request(obj), view(policy("p")), NOW),
        pods.validate(request(obj), view(policy("p"))),
    ):
        assert not decision.allowed
        assert decision.message.startswith(
            "spec.nodeName 'kwok-zone-a-0' may not be set when a pod is created in namespace "
            "team-a: a pod that names its node is bound at once, skipping the scheduler, the "
            "Pilotfish extender, its GatePolicy gates and quota placement"
        )


def test_a_system_pod_naming_its_node_is_not_gated_and_is_told_why() -> None:
    obj = pod({"app": "web"}, nodeName="kwok-zone-a-0")
    gate_view = view(policy("p", "kube-system"))
    decision = pods.mutate(request(obj, "kube-system"), gate_view, NOW)
    assert decision.patch == ()
    assert decision.warnings == (
        "not gated: the pod sets spec.nodeName, so the gates of GatePolicy p cannot hold it back",
    )


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_creation_is_gated(operation: str) -> None:
    decision = pods.mutate(
        request(pod({"app": "web"}), operation=operation), view(policy("p")), NOW
    )
    assert decision.patch == ()
    assert pods.validate(request(pod(None, [QUOTA]), operation=operation), view()).allowed


def test_an_unreadable_policy_closes_its_namespace() -> None:
    bad = policy("broken")
    bad["spec"]["gates"][0]["timeoutSeconds"] = "soon"
    gate_view = view(bad, policy("fine", namespace="team-b"))
    assert isinstance(parse_policy(bad), BrokenPolicy)
    decision = pods.mutate(request(pod({"app": "db"})), gate_view, NOW)
    assert not decision.allowed
    assert decision.message == (
        "GatePolicy broken in namespace team-a cannot be read (spec.gates.0.timeoutSeconds: "
        "Input should be a valid integer), so the gates of this namespace's pods cannot be "
        "decided; fix or delete the policy"
    )
    # Other namespaces are unaffected.
    assert pods.mutate(request(pod({"app": "web"}), "team-b"), gate_view, NOW).patch


def test_escaping_of_json_pointer_tokens() -> None:
    assert escape("gates.pilotfish.io/gated") == "gates.pilotfish.io~1gated"
    assert escape("a~b/c") == "a~0b~1c"
    assert pointer("metadata", "labels", "x/~y") == "/metadata/labels/x~1~0y"
    assert jsonpatch.JsonPointer(pointer("a/b", "~")).parts == ["a/b", "~"]


def test_plan_is_independent_of_the_patch() -> None:
    entry = parse_policy(policy("p", generation=7))
    assert isinstance(entry, PolicyEntry)
    plan = gating.plan(pod(None, [DATA_READY]), (entry,), NOW)
    assert plan.add == ()
    assert plan.gated and list(plan.records) == [DATA_READY]
    assert plan.records[DATA_READY].generation == 7


# --- validation ----------------------------------------------------------------------------

TEAM_B = policy(
    "team-b-gates",
    namespace="team-b",
    selector={},
    prefixes=["teamb.example.com/"],
    gates=[builders.gate("teamb.example.com/ready")],
)
TEAM_C = policy(
    "c",
    namespace="team-c",
    selector={},
    prefixes=["teamb.example.com/", "gates.pilotfish.io/"],
    gates=[builders.gate("teamb.example.com/other")],
)

DENIALS = [
    (
        pod({"app": "db"}, ["gates.pilotfish.io/foo"]),
        (policy("p"),),
        "gate gates.pilotfish.io/foo is not declared by any GatePolicy in namespace team-a that "
        "selects this pod (only GatePolicies may set gates.pilotfish.io/ gates)",
    ),
    (
        # Declared by a policy of the namespace that does not select the pod: still refused.
        pod({"app": "db"}, [DATA_READY, "gates.pilotfish.io/bar"]),
        (policy("p"),),
        f"gates {DATA_READY}, gates.pilotfish.io/bar are not declared by any GatePolicy in "
        "namespace team-a that selects this pod (only GatePolicies may set gates.pilotfish.io/ "
        "gates)",
    ),
    (
        pod({"app": "web"}, ["teamb.example.com/ready"]),
        (TEAM_B,),
        "namespace team-a may not use gate prefix teamb.example.com/ (gate "
        "teamb.example.com/ready): it belongs to GatePolicies in namespace team-b",
    ),
    (
        pod({"app": "web"}, ["teamb.example.com/ready", "teamb.example.com/x"]),
        (TEAM_B, TEAM_C),
        "namespace team-a may not use gate prefix teamb.example.com/ (gates "
        "teamb.example.com/ready, teamb.example.com/x): it belongs to GatePolicies in "
        "namespaces team-b, team-c",
    ),
    (
        pod({"app": "web"}, ["gates.pilotfish.io/foo", "teamb.example.com/ready"]),
        (TEAM_B,),
        "gate gates.pilotfish.io/foo is not declared by any GatePolicy in namespace team-a that "
        "selects this pod (only GatePolicies may set gates.pilotfish.io/ gates); namespace "
        "team-a may not use gate prefix teamb.example.com/ (gate teamb.example.com/ready): it "
        "belongs to GatePolicies in namespace team-b",
    ),
]


@pytest.mark.parametrize(("obj", "policies", "message"), DENIALS)
def test_denials_name_the_gate_and_the_rule(
    obj: dict[str, Any], policies: tuple[dict[str, Any], ...], message: str
) -> None:
    decision = pods.validate(request(obj), view(*policies))
    assert not decision.allowed
    assert decision.code == 403
    assert decision.message == message


ALLOWED = [
    pod({"app": "web"}),  # no gates at all
    pod({"app": "web"}, [DATA_READY]),  # declared by a selecting policy
    pod({"app": "web"}, ["example.com/own"]),  # a prefix nobody claims
    pod({"app": "web"}, ["teama.example.com/x"]),  # claimed by this namespace (and team-b)
]


@pytest.mark.parametrize("obj", ALLOWED)
def test_everything_else_is_allowed(obj: dict[str, Any]) -> None:
    team_a_too = policy(
        "a-own",
        selector={"matchLabels": {"never": "x"}},
        prefixes=["teama.example.com/"],
        gates=[builders.gate("teama.example.com/y")],
    )
    team_b_shares = policy(
        "b-shares",
        namespace="team-b",
        selector={},
        prefixes=["teama.example.com/"],
        gates=[builders.gate("teama.example.com/z")],
    )
    decision = pods.validate(request(obj), view(policy("p"), team_a_too, team_b_shares, TEAM_B))
    assert decision == Decision.allow()


def test_validation_sees_the_gates_the_mutation_added() -> None:
    gate_view = view(policy("p"))
    after = mutated(pod({"app": "web"}), gate_view)
    assert pods.validate(request(after), gate_view).allowed


def test_checks_compose() -> None:
    def no_gpus(p: PodAdmission) -> list[str]:
        return ["no GPUs for you"] if p.labels.get("gpu") else []

    checks: tuple[PodCheck, ...] = (no_gpus, *POD_CHECKS)
    admission = PodAdmission("team-a", pod({"gpu": "1"}, ["gates.pilotfish.io/x"]), view())
    found = violations(admission, checks)
    assert found[0] == "no GPUs for you"
    assert "gates.pilotfish.io/x" in found[1]


# --- the live view: nothing is admitted before it has synced ----------------------------------


GATE_POLICIES_COLLECTION = (f"{GATE_POLICIES.group}/{GATE_POLICIES.version}", GATE_POLICIES.plural)


def put_policy(api: FakeApi, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    api.put(GATE_POLICIES.path(meta["namespace"], meta["name"]), obj)


def envelope(obj: dict[str, Any], uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {**request(obj), "uid": uid},
    }


async def answer(client: Client, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(path, json=envelope(obj))
    assert resp.status == 200
    body: dict[str, Any] = (await resp.json())["response"]
    return body


def current(cache: GatePolicyCache) -> GateView:
    view_now = cache.snapshot()
    assert view_now is not None, "not synced"
    return view_now


async def until(what: str, check: Any, changed: asyncio.Event, within: float = 5.0) -> None:
    """Until check() holds, re-checking after every informer event; fail at the deadline."""
    try:
        async with asyncio.timeout(within):
            while not check():
                changed.clear()  # no await since check(): no event can slip in between
                await changed.wait()
    except TimeoutError:
        raise AssertionError(f"timed out after {within}s waiting for {what}") from None


async def test_pods_are_refused_until_the_view_has_synced_then_follow_the_watch() -> None:
    api = FakeApi()
    put_policy(api, policy("p"))
    factory = InformerFactory(api)
    cache = GatePolicyCache.watching(factory)
    changed = asyncio.Event()
    cache.informer.add_handler(lambda *_: changed.set())  # runs after the cache's own handler
    app = server.make_app(server.bind_reviews(cache, clock=lambda: NOW), ready=cache.synced)
    async with TestClient(TestServer(app)) as client:
        # Not listed yet: every pod is refused as "starting", and the server is not ready.
        assert cache.snapshot() is None
        for path in ("/mutate/pods", "/validate/pods"):
            refused = await answer(client, path, pod({"app": "web"}))
            assert refused["allowed"] is False
            assert refused["status"] == {
                "code": 503,
                "reason": "ServiceUnavailable",
                "message": pods.STARTING,
            }
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/healthz")).status == 200  # alive, just not ready

        task = asyncio.create_task(factory.run())
        try:
            await asyncio.wait_for(cache.informer.synced.wait(), timeout=5)
            assert (await client.get("/readyz")).status == 200
            gated = await answer(client, "/mutate/pods", pod({"app": "web"}))
            ops = json.loads(base64.b64decode(gated["patch"]))
            after = jsonpatch.apply_patch(pod({"app": "web"}), ops)
            assert after["spec"]["schedulingGates"] == [{"name": DATA_READY}]
            assert after["metadata"]["annotations"][ANNOTATION_CREATED] == CREATED

            # Changes arrive by the watch: a new policy of team-b, then p deleted.
            other = policy(
                "q",
                namespace="team-b",
                selector={},
                prefixes=["teamb.example.com/"],
                gates=[builders.gate("teamb.example.com/ready")],
            )
            put_policy(api, other)
            api.remove(GATE_POLICIES.path("team-a", "p"))
            await until(
                "p gone from the view", lambda: not current(cache).in_namespace("team-a"), changed
            )
            assert "patch" not in await answer(client, "/mutate/pods", pod({"app": "web"}))
            denied = await answer(client, "/validate/pods", pod(None, ["teamb.example.com/ready"]))
            assert denied["allowed"] is False
            assert "belongs to GatePolicies in namespace team-b" in denied["status"]["message"]

            # q is deleted without the watch seeing it, and the watch's resume is 410 Gone:
            # only the relist can tell the view that q is gone.
            del api.store(*GATE_POLICIES_COLLECTION)["team-b/q"]
            api.fail_next("WATCH", GATE_POLICIES.path(), 410)
            await api.close_watches()
            await until("the relist", lambda: current(cache).in_namespace("team-b") == (), changed)
            lists = [c for c in api.calls if c.method == "GET" and c.path == GATE_POLICIES.path()]
            assert len(lists) == 2
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def test_an_empty_static_view_gates_nothing() -> None:
    assert StaticViews(GateView()).snapshot() == GateView()
    review = server.REVIEWS["/mutate/pods"]
    assert review(request(pod({"app": "web"}))) == Decision.mutate(())


async def test_a_view_that_stops_updating_stops_the_server() -> None:
    async def serving() -> None:
        await asyncio.Event().wait()

    async def informer_crashes() -> None:
        raise KeyError("metadata")

    async def informer_returns() -> None:
        return None

    with pytest.raises(TaskDied, match="KeyError"):
        await asyncio.wait_for(
            run_guarded({"webhooks": serving(), "informers": informer_crashes()}), 5
        )
    with pytest.raises(TaskDied, match="'informers' stopped: ended without an error"):
        await asyncio.wait_for(
            run_guarded({"webhooks": serving(), "informers": informer_returns()}), 5
        )


# --- the chart's side: who may remove gates, who may raise signals -------------------------


def render(template: str, *args: str) -> list[dict[str, Any]]:
    out = helm("template", "t", str(CHART), "-n", "pilotfish-system", "-s", template, *args).stdout
    return [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]


@needs_helm
@pytest.mark.parametrize(
    ("args", "namespace", "groups", "message"),
    [
        (
            (),
            "pilotfish-system",
            '["pilotfish:gate-releasers"]',
            "only pilotfish-operator (or members of pilotfish:gate-releasers) may remove "
            "gates.pilotfish.io/ gates",
        ),
        (
            ("--set", "local.enabled=true", "--set", "local.caBundle=Zm9v", "-n", "pf"),
            "pf",
            '["pilotfish:gate-releasers"]',
            "only pilotfish-operator (or members of pilotfish:gate-releasers) may remove "
            "gates.pilotfish.io/ gates",
        ),
        (
            ("--set-json", 'gates={"releaserGroups":["oncall","sre"]}'),
            "pilotfish-system",
            '["oncall","sre"]',
            "only pilotfish-operator (or members of oncall, sre) may remove gates.pilotfish.io/ "
            "gates",
        ),
        (
            ("--set-json", 'gates={"releaserGroups":[]}'),
            "pilotfish-system",
            None,
            "only pilotfish-operator may remove gates.pilotfish.io/ gates",
        ),
    ],
)
def test_gate_ownership_policy(
    args: tuple[str, ...], namespace: str, groups: str | None, message: str
) -> None:
    policy_doc, binding = render("templates/gate-admission-policy.yaml", *args)
    assert (policy_doc["kind"], binding["kind"]) == (
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    assert policy_doc["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy_doc["metadata"]["name"] == binding["spec"]["policyName"]
    assert binding["metadata"]["name"] == "pilotfish-gate-ownership"
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec = policy_doc["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]
    owner = next(v["expression"] for v in spec["variables"] if v["name"] == "owner")
    assert f'"system:serviceaccount:{namespace}:pilotfish-operator"' in owner
    assert (groups is None) == ("groups" not in owner)
    if groups is not None:
        assert groups in owner
    [validation] = spec["validations"]
    assert validation["message"] == message
    assert json.dumps(message) in validation["messageExpression"]


@needs_helm
def test_gatesignal_writer_role_grants_signals_and_nothing_else() -> None:
    [role] = render("templates/rbac-gatesignals.yaml")
    assert (role["kind"], role["metadata"]["name"]) == (
        "ClusterRole",
        "pilotfish-gatesignal-writer",
    )
    assert "namespace" not in role["metadata"]
    assert role["rules"] == [
        {
            "apiGroups": ["pilotfish.io"],
            "resources": ["gatesignals"],
            "verbs": ["get", "list", "watch", "create", "update", "patch"],
        },
        {
            "apiGroups": ["pilotfish.io"],
            "resources": ["gatesignals/status"],
            "verbs": ["get", "update", "patch"],
        },
    ]


def test_values_document_releasers_and_the_writer_binding() -> None:
    values_text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    assert values["gates"] == {"releaserGroups": ["pilotfish:gate-releasers"]}
    assert "--clusterrole=pilotfish-gatesignal-writer" in values_text
    prose = " ".join(values_text.replace("#", " ").split())
    assert "with a RoleBinding in its own namespace" in prose
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["gates"]["additionalProperties"] is False
