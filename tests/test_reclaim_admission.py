"""Reclaim at pod creation: batch pods moved onto `batch.pilotfish.io/*`, production memory
limit = request, forged batch requests refused, and quota charges unchanged by it all."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import names, quantity, quota
from pilotfish.webhooks import pods, reclaim
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.teamview import TeamSnapshot

Obj = dict[str, Any]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
ON = reclaim.Setting(True, "test")
OFF = reclaim.Setting(False, "test")


def container(name: str, requests: Obj | None = None, limits: Obj | None = None) -> Obj:
    resources: Obj = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "example/app:1", "resources": resources}


def make_pod(band: str | None, *containers: Obj, init: list[Obj] | None = None) -> Obj:
    labels = {"app": "x"} if band is None else {names.LABEL_BAND: band}
    spec: Obj = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "shop", "labels": labels}, "spec": spec}


def review(pod: Obj) -> Obj:
    return {
        "uid": "r",
        "operation": "CREATE",
        "namespace": "shop",
        "kind": {"kind": "Pod"},
        "object": pod,
    }


def team(reclaim_label: str | None = "enabled") -> TeamSnapshot:
    labels = {names.LABEL_TEAM: "payments"}
    if reclaim_label is not None:
        labels[names.LABEL_RECLAIM] = reclaim_label
    return TeamSnapshot({"shop": labels}, ())


def mutate(pod: Obj, snapshot: TeamSnapshot, default: bool = False) -> tuple[bool, str, Obj]:
    decision = pods.mutate(
        review(pod), GateView(), NOW, snapshot, "pilotfish-scheduler", reclaim_default=default
    )
    out: Obj = jsonpatch.apply_patch(copy.deepcopy(pod), list(decision.patch or []))
    return decision.allowed, decision.message or "", out


def resources_of(pod: Obj, index: int = 0, key: str = "containers") -> Obj:
    resources: Obj = pod["spec"][key][index]["resources"]
    return resources


def defaulted(pod: Obj) -> Obj:
    """The pod as the API server stores it: a missing request defaults to the limit."""
    out = copy.deepcopy(pod)
    for key in ("containers", "initContainers"):
        for c in out["spec"].get(key) or []:
            res = c.setdefault("resources", {})
            for name, value in (res.get("limits") or {}).items():
                res.setdefault("requests", {}).setdefault(name, value)
    return out


def charge(pod: Obj) -> dict[str, Fraction]:
    return {r: v for r, v in quota.pod_requests(pod).items() if v}


# --- the translation -------------------------------------------------------------------


def test_batch_pod_is_moved_onto_batch_resources_with_the_originals_recorded() -> None:
    pod = make_pod(
        "batch",
        container(
            "main",
            {"cpu": "1500m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
            {"cpu": "2", "memory": "2Gi"},
        ),
        container("side", limits={"cpu": "250m"}),
        init=[container("setup", {"memory": "100M"})],
    )
    allowed, _, out = mutate(pod, team())
    assert allowed
    assert resources_of(out) == {
        "requests": {
            "ephemeral-storage": "1Gi",
            names.BATCH_CPU: "1500",
            names.BATCH_MEMORY: str(2**30),
        },
        "limits": {names.BATCH_CPU: "1500", names.BATCH_MEMORY: str(2**30)},
    }
    # only a limit: the request the API server would default from it
    assert resources_of(out, 1) == {
        "requests": {names.BATCH_CPU: "250"},
        "limits": {names.BATCH_CPU: "250"},
    }
    assert resources_of(out, 0, "initContainers") == {
        "requests": {names.BATCH_MEMORY: "100000000"},
        "limits": {names.BATCH_MEMORY: "100000000"},
    }
    record = json.loads(out["metadata"]["annotations"][names.ANNOTATION_ORIGINAL_RESOURCES])
    assert record == {
        "containers": {
            "main": {
                "requests": {"cpu": "1500m", "memory": "1Gi"},
                "limits": {"cpu": "2", "memory": "2Gi"},
            },
            "side": {"limits": {"cpu": "250m"}},
        },
        "initContainers": {"setup": {"requests": {"memory": "100M"}}},
    }
    assert quota.pod_requests(out) == quota.pod_requests(defaulted(pod))


def test_a_limit_only_container_gets_the_batch_request_too() -> None:
    allowed, _, out = mutate(make_pod("batch", container("c", limits={"cpu": "250m"})), team())
    assert allowed
    assert resources_of(out) == {
        "requests": {names.BATCH_CPU: "250"},
        "limits": {names.BATCH_CPU: "250"},
    }


def test_best_effort_band_is_translated_and_production_is_not() -> None:
    _, _, be = mutate(make_pod("best-effort", container("c", {"cpu": "1"})), team())
    assert resources_of(be)["requests"] == {names.BATCH_CPU: "1000"}
    _, _, prod = mutate(make_pod("production", container("c", {"cpu": "1"})), team())
    assert resources_of(prod) == {"requests": {"cpu": "1"}}


def test_a_pod_naming_no_band_is_batch_and_translated() -> None:
    _, _, out = mutate(make_pod(None, container("c", {"cpu": "100m"})), team())
    assert out["metadata"]["labels"][names.LABEL_BAND] == "batch"
    assert resources_of(out)["requests"] == {names.BATCH_CPU: "100"}


@pytest.mark.parametrize(
    ("label", "default", "translated"),
    [
        (None, False, False),
        (None, True, True),
        ("enabled", False, True),
        ("disabled", True, False),
    ],
)
def test_namespace_label_over_cluster_default(
    label: str | None, default: bool, translated: bool
) -> None:
    pod = make_pod("batch", container("c", {"cpu": "1", "memory": "1Gi"}))
    allowed, _, out = mutate(pod, team(label), default)
    assert allowed
    assert (names.BATCH_CPU in resources_of(out)["requests"]) == translated
    if not translated:
        assert resources_of(out) == resources_of(pod)
        assert names.ANNOTATION_ORIGINAL_RESOURCES not in (out["metadata"].get("annotations") or {})


def test_a_bad_namespace_label_refuses_the_pod_naming_it() -> None:
    allowed, message, _ = mutate(make_pod("batch", container("c", {"cpu": "1"})), team("yes"))
    assert not allowed
    assert "namespace shop label pilotfish.io/reclaim='yes' is not one of enabled, disabled" in (
        message
    )


def test_cluster_default_from_env() -> None:
    assert reclaim.default_from_env({}) is False
    assert reclaim.default_from_env({"PILOTFISH_RECLAIM": "on"}) is True
    assert reclaim.default_from_env({"PILOTFISH_RECLAIM": "off"}) is False
    with pytest.raises(ValueError, match=r"PILOTFISH_RECLAIM='true' is not one of on, off"):
        reclaim.default_from_env({"PILOTFISH_RECLAIM": "true"})


def test_a_bad_cluster_default_stops_the_webhooks_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pilotfish.cli import main as cli

    monkeypatch.delenv("PILOTFISH_EVICTION_WAIT_SECONDS", raising=False)
    monkeypatch.setenv("PILOTFISH_RECLAIM", "yes")
    args = cli.parser().parse_args(["webhooks", "--cert", "c.pem", "--key", "k.pem"])
    assert cli._webhooks(args) == 2
    assert "PILOTFISH_RECLAIM='yes' is not one of on, off" in capsys.readouterr().err


def test_a_forged_annotation_is_not_kept() -> None:
    pod = make_pod("production", container("c", {"cpu": "1"}))
    pod["metadata"]["annotations"] = {names.ANNOTATION_ORIGINAL_RESOURCES: '{"lie": 1}'}
    _, _, out = mutate(pod, team(None))
    assert out["metadata"]["annotations"] == {}


# --- production memory -----------------------------------------------------------------


def test_production_memory_limit_is_set_to_the_request() -> None:
    pod = make_pod(
        "production",
        container("none", {"cpu": "1", "memory": "1Gi"}),
        container("higher", {"memory": "1Gi"}, {"memory": "4Gi", "cpu": "2"}),
        container("equal", {"memory": "1024Mi"}, {"memory": "1Gi"}),
        container("limit-only", limits={"memory": "2Gi"}),
        container("no-memory", {"cpu": "1"}),
    )
    allowed, _, out = mutate(pod, team())
    assert allowed
    assert resources_of(out, 0)["limits"] == {"memory": "1Gi"}
    assert resources_of(out, 1)["limits"] == {"memory": "1Gi", "cpu": "2"}
    assert resources_of(out, 2)["limits"] == {"memory": "1Gi"}
    assert resources_of(out, 3) == {"limits": {"memory": "2Gi"}}
    assert resources_of(out, 4) == {"requests": {"cpu": "1"}}


def test_production_memory_is_left_alone_where_reclaim_is_off() -> None:
    pod = make_pod("production", container("c", {"memory": "1Gi"}, {"memory": "4Gi"}))
    _, _, out = mutate(pod, team(None))
    assert resources_of(out) == {"requests": {"memory": "1Gi"}, "limits": {"memory": "4Gi"}}


# --- forged batch requests ---------------------------------------------------------------


def test_production_may_not_request_batch_resources_in_any_namespace() -> None:
    for label in ("enabled", None):
        pod = make_pod(
            "production",
            container("c", {"cpu": "1", names.BATCH_CPU: "4000"}, {names.BATCH_CPU: "4000"}),
        )
        allowed, message, _ = mutate(pod, team(label))
        assert not allowed
        assert (
            "spec.containers[0].resources.requests[batch.pilotfish.io/cpu]: 4000 is refused: "
            "production pods may not request batch.pilotfish.io/cpu"
        ) in message
        assert "spec.containers[0].resources.limits[batch.pilotfish.io/cpu]" in message


def test_batch_resources_are_refused_where_reclaim_is_off() -> None:
    pod = make_pod("batch", container("c", {names.BATCH_MEMORY: "1000"}))
    allowed, message, _ = mutate(pod, team(None))
    assert not allowed
    assert (
        "spec.containers[0].resources.requests[batch.pilotfish.io/memory]: 1000 is refused: "
        "batch.pilotfish.io/memory is reclaimed capacity and reclaim is off in namespace shop "
        "(the cluster default PILOTFISH_RECLAIM=off); request memory instead"
    ) in message


def test_a_batch_pod_mixing_cpu_and_batch_cpu_in_one_container_is_refused() -> None:
    pod = make_pod("batch", container("c", {"cpu": "1"}, {names.BATCH_CPU: "10"}))
    allowed, message, _ = mutate(pod, team())
    assert not allowed
    assert (
        "spec.containers[0].resources.limits[batch.pilotfish.io/cpu]: 10 is refused: the "
        "container also names cpu"
    ) in message


def test_a_batch_pod_already_on_batch_resources_is_admitted_as_it_is() -> None:
    batch = {names.BATCH_CPU: "500"}
    pod = make_pod("batch", container("c", {**batch, "memory": "1Gi"}, dict(batch)))
    allowed, _, out = mutate(pod, team())
    assert allowed
    assert resources_of(out) == {
        "requests": {names.BATCH_CPU: "500", names.BATCH_MEMORY: str(2**30)},
        "limits": {names.BATCH_CPU: "500", names.BATCH_MEMORY: str(2**30)},
    }
    assert quota.pod_requests(out)["cpu"] == Fraction(1, 2)


def test_pod_level_resources_are_refused_for_a_translated_pod() -> None:
    pod = make_pod("batch", container("c"))
    pod["spec"]["resources"] = {"requests": {"cpu": "1"}}
    allowed, message, _ = mutate(pod, team())
    assert not allowed
    assert "spec.resources.requests.cpu: pod-level cpu cannot be placed on reclaimed" in message


def test_cpu_beyond_what_millicores_hold_is_refused() -> None:
    pod = make_pod("batch", container("c", {"cpu": "9e17"}))
    allowed, message, _ = mutate(pod, team())
    assert not allowed
    assert "spec.containers[0].resources.requests.cpu: 9e17 is more than" in message


# --- properties --------------------------------------------------------------------------

millis = st.integers(0, 64_000)
byte_counts = st.integers(0, 2**40)


@st.composite
def amounts(draw: st.DrawFn) -> tuple[Obj | None, Obj | None]:
    """A container's requests and limits as a tenant writes them (limit ≥ request)."""
    requests: Obj = {}
    limits: Obj = {}
    cpu = draw(st.none() | millis)
    if cpu is not None:
        text = draw(st.sampled_from([f"{cpu}m", quantity.canonical(Fraction(cpu, 1000))]))
        if draw(st.booleans()):
            requests["cpu"] = text
        if draw(st.booleans()):
            limits["cpu"] = f"{cpu + draw(millis)}m"
    memory = draw(st.none() | byte_counts)
    if memory is not None:
        if draw(st.booleans()):
            requests["memory"] = quantity.canonical(memory, quantity.format_for("memory"))
        if draw(st.booleans()):
            limits["memory"] = str(memory + draw(byte_counts))
    if draw(st.booleans()):
        requests["ephemeral-storage"] = "1Gi"
    return (requests or None), (limits or None)


@st.composite
def batch_pods(draw: st.DrawFn) -> Obj:
    mains = draw(st.lists(amounts(), min_size=1, max_size=3))
    inits = draw(st.lists(amounts(), max_size=2))
    return make_pod(
        draw(st.sampled_from(["batch", "best-effort"])),
        *(container(f"c{i}", r, lim) for i, (r, lim) in enumerate(mains)),
        init=[container(f"i{i}", r, lim) for i, (r, lim) in enumerate(inits)],
    )


@settings(max_examples=150, deadline=None)
@given(batch_pods())
def test_translation_moves_everything_and_keeps_the_quota_charge(pod: Obj) -> None:
    allowed, message, out = mutate(pod, team())
    assert allowed, message
    # Quota charges the translated pod exactly what the original asked (zero is no charge).
    assert charge(out) == charge(defaulted(pod))
    record = json.loads(
        (out["metadata"].get("annotations") or {}).get(
            names.ANNOTATION_ORIGINAL_RESOURCES, '{"containers": {}, "initContainers": {}}'
        )
    )
    for key in ("containers", "initContainers"):
        for before, after in zip(
            defaulted(pod)["spec"].get(key) or [], out["spec"].get(key) or [], strict=True
        ):
            res = after.get("resources") or {}
            for kind in ("requests", "limits"):
                assert not {"cpu", "memory"} & set(res.get(kind) or {}), (key, res)
            asked = before["resources"].get("requests") or {}
            requests, limits = res.get("requests") or {}, res.get("limits") or {}
            for plain, twin, unit in (
                ("cpu", names.BATCH_CPU, quantity.milli),
                ("memory", names.BATCH_MEMORY, quantity.whole),
            ):
                assert requests.get(twin) == limits.get(twin)  # extended: request == limit
                if unit(asked.get(plain, 0)) > 0:
                    value = requests[twin]
                    assert value == str(int(value))  # a whole number
                    assert Fraction(int(value)) * (1000 if plain == "cpu" else 1) >= (
                        quantity.parse(asked[plain]) * (1000 if plain == "cpu" else 1)
                    )
                else:
                    assert twin not in requests
            original = (pod["spec"].get(key) or [])[(out["spec"].get(key) or []).index(after)].get(
                "resources"
            ) or {}
            moved = {
                kind: {
                    r: v for r, v in (original.get(kind) or {}).items() if r in ("cpu", "memory")
                }
                for kind in ("requests", "limits")
            }
            moved = {k: v for k, v in moved.items() if v}
            assert record[key].get(after["name"], {}) == moved
            assert res.get("requests", {}).get("ephemeral-storage") == (
                (original.get("requests") or {}).get("ephemeral-storage")
            )


# --- quota reads batch resources back as cpu and memory ----------------------------------


def test_pod_requests_counts_batch_resources_as_cpu_and_memory() -> None:
    pod = make_pod(
        "batch",
        container("a", {names.BATCH_CPU: "1500", names.BATCH_MEMORY: "1073741824"}),
        container("b", {"cpu": "250m", "nvidia.com/gpu": "1"}),
        init=[container("i", {names.BATCH_CPU: "2000", "memory": "2Gi"})],
    )
    # containers 1.5 + 0.25 cores and 1Gi; the init container's peak (2 cores, 2Gi) wins
    assert quota.pod_requests(pod) == {
        "cpu": Fraction(2),
        "memory": Fraction(2 * 2**30),
        "gpus": Fraction(1),
        "pods": Fraction(1),
    }
    pod["spec"]["initContainers"] = []
    assert quota.pod_requests(pod)["cpu"] == Fraction(7, 4)
    assert quota.pod_requests(pod)["memory"] == Fraction(2**30)
    assert names.BATCH_CPU not in quota.pod_requests(pod)
