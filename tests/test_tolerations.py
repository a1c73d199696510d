"""Lost-node tolerations of tenant pods, through the pod mutation and the HTTPS app: upstream's
300 s default becomes the eviction wait, a pod's own toleration stays, an at-most-one pod
tolerates a lost node forever, and system pods are left alone."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer

from pilotfish import names
from pilotfish.webhooks import pods, server, tolerations
from pilotfish.webhooks.gatecache import StaticViews
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.teamview import TeamSnapshot

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NOT_READY, UNREACHABLE = tolerations.NOT_READY, tolerations.UNREACHABLE


def default(key: str, seconds: int | None = 300) -> dict[str, Any]:
    """A toleration as upstream's DefaultTolerationSeconds plugin adds it (seconds=None:
    the forever form a DaemonSet's pods carry)."""
    t: dict[str, Any] = {"key": key, "operator": "Exists", "effect": "NoExecute"}
    if seconds is not None:
        t["tolerationSeconds"] = seconds
    return t


UPSTREAM = [default(NOT_READY), default(UNREACHABLE)]


def pod(
    tolerations_: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "web-0"}
    if annotations and names.ANNOTATION_EPOCH in annotations:  # as its ServiceWorkload makes it
        meta["ownerReferences"] = [{"kind": "ServiceWorkload", "name": "web", "controller": True}]
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "nginx"}]}
    if tolerations_ is not None:
        spec["tolerations"] = tolerations_
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def request(obj: dict[str, Any], namespace: str = "shop") -> dict[str, Any]:
    return {
        "uid": "r",
        "operation": "CREATE",
        "namespace": namespace,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "object": obj,
    }


def admitted(
    obj: dict[str, Any],
    namespace: str = "shop",
    wait: float = 60,
    team: TeamSnapshot | None = None,
) -> dict[str, Any]:
    """The pod as the API server stores it after the mutation's patch."""
    decision = pods.mutate(request(obj, namespace), GateView(), NOW, team, eviction_wait=wait)
    assert decision.allowed, decision.message
    out: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(obj), list(decision.patch))
    return out


def lost_node(obj: dict[str, Any]) -> dict[str, Any]:
    """key -> tolerationSeconds (None: forever) of the tolerations of the two taints."""
    return {
        t["key"]: t.get("tolerationSeconds")
        for t in obj["spec"].get("tolerations") or []
        if t.get("key") in (NOT_READY, UNREACHABLE)
    }


def test_upstreams_default_becomes_the_eviction_wait() -> None:
    out = admitted(pod(copy.deepcopy(UPSTREAM)))
    assert out["spec"]["tolerations"] == [default(NOT_READY, 60), default(UNREACHABLE, 60)]


def test_the_configured_wait_is_used_in_whole_seconds_rounded_up() -> None:
    assert lost_node(admitted(pod(copy.deepcopy(UPSTREAM)), wait=45)) == {
        NOT_READY: 45,
        UNREACHABLE: 45,
    }
    assert lost_node(admitted(pod(copy.deepcopy(UPSTREAM)), wait=12.2)) == {
        NOT_READY: 13,
        UNREACHABLE: 13,
    }


def test_a_pod_without_tolerations_gets_none() -> None:
    # No DefaultTolerationSeconds on this API server: its own rule (evict at once) stands.
    assert pods.mutate(request(pod()), GateView(), NOW).patch == ()
    assert pods.mutate(request(pod([])), GateView(), NOW).patch == ()


def test_a_pods_own_tolerations_are_kept() -> None:
    own = [
        default(NOT_READY, 900),  # prefers to wait for its machine: not capped
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"},  # forever
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    ]
    assert pods.mutate(request(pod(copy.deepcopy(own))), GateView(), NOW).patch == ()


def test_only_the_upstream_shaped_one_is_rewritten_beside_the_pods_own() -> None:
    given = [default(NOT_READY, 30), default(UNREACHABLE)]
    assert lost_node(admitted(pod(given))) == {NOT_READY: 30, UNREACHABLE: 60}


def test_other_taints_and_effects_are_not_touched() -> None:
    others: list[dict[str, Any]] = [
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "example.com/spot",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
        *UPSTREAM,
    ]
    out = admitted(pod(copy.deepcopy(others)))
    assert out["spec"]["tolerations"][:2] == others[:2]
    assert lost_node(out) == {NOT_READY: 60, UNREACHABLE: 60}


def test_an_at_most_one_pod_tolerates_a_lost_node_forever() -> None:
    amo = {names.ANNOTATION_EPOCH: "3"}
    out = admitted(pod(copy.deepcopy(UPSTREAM), amo))
    assert out["spec"]["tolerations"] == [default(NOT_READY, None), default(UNREACHABLE, None)]
    # Added when the API server added none, so upstream can never evict it.
    out = admitted(pod(None, amo))
    assert out["spec"]["tolerations"] == [default(NOT_READY, None), default(UNREACHABLE, None)]
    # Its own timed tolerations, a wildcard's too, lose their time (the shortest one counts).
    wildcard = {"operator": "Exists", "tolerationSeconds": 10}
    out = admitted(pod([default(NOT_READY, 30), wildcard], amo))
    assert out["spec"]["tolerations"] == [default(NOT_READY, None), {"operator": "Exists"}]


def test_the_epoch_annotation_alone_does_not_make_a_pod_tolerate_forever() -> None:
    """A tenant's raw pod carrying pilotfish.io/epoch, no ServiceWorkload behind it, is an
    ordinary pod: nothing would ever release it."""
    forged = pod(copy.deepcopy(UPSTREAM), {names.ANNOTATION_EPOCH: "3"})
    del forged["metadata"]["ownerReferences"]
    assert lost_node(admitted(forged)) == {NOT_READY: 60, UNREACHABLE: 60}


def test_the_patch_follows_the_team_labels_patch() -> None:
    """The team label patch comes first and creates `metadata.labels`; the toleration ops are
    computed on the pod as it left it, so the whole patch applies in order."""
    team = TeamSnapshot({"shop": {names.LABEL_TEAM: "payments"}}, ())
    out = admitted(pod(copy.deepcopy(UPSTREAM)), team=team)
    assert out["metadata"]["labels"][names.LABEL_TEAM] == "payments"
    assert lost_node(out) == {NOT_READY: 60, UNREACHABLE: 60}


@pytest.mark.parametrize("namespace", ["kube-system", names.SYSTEM_NAMESPACE, "kube-node-lease"])
def test_system_namespaces_are_left_alone(namespace: str) -> None:
    for obj in (pod(copy.deepcopy(UPSTREAM)), pod(None, {names.ANNOTATION_EPOCH: "1"})):
        assert pods.mutate(request(obj, namespace), GateView(), NOW).patch == ()


def test_mirror_pods_are_left_alone() -> None:
    mirror = pod(copy.deepcopy(UPSTREAM), {tolerations.MIRROR_ANNOTATION: "abc"})
    assert pods.mutate(request(mirror), GateView(), NOW).patch == ()


def test_the_wait_is_read_from_the_operators_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PILOTFISH_EVICTION_WAIT_SECONDS", raising=False)
    assert tolerations.eviction_wait_from_env() == 60
    monkeypatch.setenv("PILOTFISH_EVICTION_WAIT_SECONDS", "25")
    assert tolerations.eviction_wait_from_env() == 25
    for bad in ("soon", "-1"):
        monkeypatch.setenv("PILOTFISH_EVICTION_WAIT_SECONDS", bad)
        with pytest.raises(ValueError, match=f"PILOTFISH_EVICTION_WAIT_SECONDS='{bad}'"):
            tolerations.eviction_wait_from_env()


def test_a_bad_wait_stops_the_webhooks_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pilotfish.cli import main as cli

    monkeypatch.setenv("PILOTFISH_EVICTION_WAIT_SECONDS", "a minute")
    args = cli.parser().parse_args(["webhooks", "--cert", "c.pem", "--key", "k.pem"])
    assert cli._webhooks(args) == 2
    err = capsys.readouterr().err
    assert "PILOTFISH_EVICTION_WAIT_SECONDS='a minute': must be a number of seconds" in err


def review(obj: dict[str, Any], namespace: str = "shop") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "tol-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web-0",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "dryRun": False,
        },
    }


async def test_the_https_app_answers_with_the_configured_wait() -> None:
    app = server.make_app(server.bind_reviews(StaticViews(GateView()), eviction_wait=45))
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/mutate/pods", json=review(pod(copy.deepcopy(UPSTREAM))))
        assert resp.status == 200
        answer = (await resp.json())["response"]
        assert answer["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(answer["patch"]))
        out = jsonpatch.apply_patch(pod(copy.deepcopy(UPSTREAM)), ops)
        assert lost_node(out) == {NOT_READY: 45, UNREACHABLE: 45}

        resp = await client.post(
            "/mutate/pods", json=review(pod(copy.deepcopy(UPSTREAM)), "kube-system")
        )
        assert (await resp.json())["response"] == {"uid": "tol-1", "allowed": True}

        bad = pod([{"key": UNREACHABLE, "tolerationSeconds": "300"}])
        resp = await client.post("/mutate/pods", json=review(bad))
        answer = (await resp.json())["response"]
        assert answer["allowed"] is False and "tolerationSeconds" in answer["status"]["message"]
