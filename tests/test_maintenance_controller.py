"""The maintenance controller's writes on the in-memory API (`tests.fakeapi`), with the real
informers, OwnWrites and queue results; kopf's part is played by the harness
(`tests.maintenance_cluster`), and kopf's own wiring is checked on its registry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from pilotfish import names
from pilotfish.devcluster import kubeconfig
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import JSON_PATCH, NODEMAINTENANCES, NODES, PODS, ApiError, Rest
from pilotfish.operators.maintenance import apply, kopfwire
from pilotfish.operators.maintenance.model import PodRef
from tests.fakeapi import FakeApi, eviction_refused
from tests.maintenance_cluster import NM, Cluster, maintenance, metric, start
from tests.nodelifecycle_harness import NS

DRAINING = names.ANNOTATION_DRAINING
CORDONED_BY = names.ANNOTATION_CORDONED_BY


@pytest.fixture
async def c() -> AsyncIterator[Cluster]:
    cluster = await start()
    yield cluster
    await cluster.stop()


def marks(c: Cluster, node: str) -> dict[str, str]:
    return dict(c.node(node)["metadata"].get("annotations") or {})


async def test_a_node_is_cordoned_by_one_patch_conditional_on_its_version(c: Cluster) -> None:
    c.add_node("n1")
    c.add_pod("a", "n1")
    c.add_nm("n1")
    await c.api.settle()
    seen = c.node("n1")["metadata"]["resourceVersion"]
    c.feed()
    await c.ctrl.reconcile(NM)
    (patch,) = c.api.writes("/nodes/n1")
    assert patch.content_type == JSON_PATCH
    assert patch.body[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": seen}
    node = c.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert marks(c, "n1") == {DRAINING: NM, CORDONED_BY: NM}


async def test_a_cordon_decided_from_a_stale_copy_is_refused_and_nothing_is_evicted(
    c: Cluster,
) -> None:
    c.add_node("n1")
    c.add_pod("a", "n1")
    c.add_nm("n1")
    await c.api.settle()
    relabelled = c.node("n1")
    relabelled["metadata"]["labels"]["team"] = "infra"  # someone else's write, in between
    c.api.before("PATCH", "/nodes/n1", lambda: c.api.put(NODES.path(name="n1"), relabelled))
    c.feed()
    result = await c.ctrl.reconcile(NM)
    assert result.retry
    assert "unschedulable" not in c.node("n1")["spec"]
    assert c.evictions() == []
    await c.sweep()  # decided again from the fresh copy
    assert c.node("n1")["spec"]["unschedulable"] is True
    assert c.node("n1")["metadata"]["labels"]["team"] == "infra"
    assert c.node_states() == {"n1": "Drained"}


async def test_a_429_is_a_refusal_retried_with_backoff_never_an_error(c: Cluster) -> None:
    c.add_node("n1")
    c.add_pod("a", "n1")
    c.add_nm("n1")
    await c.api.settle()
    c.api.fail_next("POST", "/eviction", 429, body=eviction_refused("web"))
    refused_before = metric("pilotfish_maintenance_evictions_total", result="refused")
    errors_before = metric("pilotfish_operator_reconcile_errors_total", controller="maintenance")
    c.feed()
    result = await c.ctrl.reconcile(NM)
    assert not result.retry and result.after == pytest.approx(1.0)
    assert metric("pilotfish_maintenance_evictions_total", result="refused") == refused_before + 1
    assert (
        metric("pilotfish_operator_reconcile_errors_total", controller="maintenance")
        == errors_before
    )
    await c.api.settle()
    # The next round reports the refusal, naming the budget, and does not ask again yet.
    await c.ctrl.reconcile(NM)
    (entry,) = c.status()["nodes"]
    (blocker,) = entry["blockers"]
    assert blocker["reason"] == "EvictionRefused" and blocker["budget"] == f"{NS}/web"
    assert "needs 1 healthy pods" in blocker["message"]
    assert len(c.evictions()) == 1
    c.clock.advance(1.0)
    await c.sweep()
    assert len(c.evictions()) == 2
    assert c.node_states() == {"n1": "Drained"}
    assert c.ctrl.refused[NM] == {}


async def test_refusals_back_off_per_pod(c: Cluster) -> None:
    c.add_node("n1")
    c.add_pod("a", "n1")
    c.add_nm("n1")
    await c.api.settle()
    delays = []
    for _ in range(3):
        c.api.fail_next("POST", "/eviction", 429, body=eviction_refused("web"))
        c.feed()
        delays.append((await c.ctrl.reconcile(NM)).after or 0.0)
        await c.api.settle()
        c.clock.advance(delays[-1])
    assert delays == sorted(delays) and delays[-1] > delays[0]


async def test_an_event_per_transition(c: Cluster) -> None:
    for n in ("n1", "n2"):
        c.add_node(n)
        c.add_pod(f"p-{n}", n)
    c.add_nm("n1", "n2")
    await c.sweep()
    assert c.status()["phase"] == "Done" and c.status()["progress"] == "2/2"
    assert len(await c.events("DrainStarted")) == 2
    drained = await c.events("NodeDrained")
    assert len(drained) == 2
    assert all(e["regarding"]["kind"] == "NodeMaintenance" for e in drained)
    assert {e["regarding"]["name"] for e in drained} == {NM}
    assert len(await c.events("MaintenanceComplete")) == 1
    await c.sweep()  # nothing changes, nothing is said again
    assert len(await c.events("NodeDrained")) == 2
    assert c.evictions() == ["p-n1", "p-n2"]


async def test_a_transition_whose_status_write_was_refused_is_still_told(c: Cluster) -> None:
    c.add_node("n1")
    c.add_pod("a", "n1")
    c.add_nm("n1")
    await c.api.settle()
    c.api.fail_next("PATCH", "/status", 409)  # kopf's own patch came first
    c.feed()
    assert (await c.ctrl.reconcile(NM)).retry
    c.kubelet()  # the node drains before the next round: it never sees it Draining
    await c.sweep()
    assert c.node_states() == {"n1": "Drained"}
    assert len(await c.events("DrainStarted")) == 1
    assert len(await c.events("NodeDrained")) == 1


async def test_own_writes_are_awaited_before_deciding_again() -> None:
    c = await start()
    c.add_node("n1")
    c.add_pod("a", "n1")
    c.add_nm("n1")
    await c.api.settle()
    await c.stop()  # the informers see nothing more: our writes stay unobserved
    c.feed()
    await c.ctrl.reconcile(NM)
    writes = len(c.api.writes())
    assert c.evictions() == ["a"]
    result = await c.ctrl.reconcile(NM)
    assert result.after is not None and "not yet observed" in result.why
    assert len(c.api.writes()) == writes


async def test_deletion_uncordons_only_what_it_cordoned_then_the_finalizer_goes(
    c: Cluster,
) -> None:
    c.add_node("mine")
    c.add_node("theirs", unschedulable=True)  # cordoned by someone else first
    c.add_node("other")
    c.add_nm("mine", "theirs", maxConcurrent=2)
    c.add_nm("other", name="kernel")
    await c.sweep()
    assert marks(c, "mine") == {DRAINING: NM, CORDONED_BY: NM}
    assert marks(c, "theirs") == {DRAINING: NM}
    c.ctrl.saw(NM, c.nm())
    assert not await c.ctrl.released(NM, 0.01)  # not being deleted: nothing released

    await c.api.delete(NODEMAINTENANCES.path(name=NM))  # the finalizer holds it
    assert c.nm()["metadata"]["deletionTimestamp"]
    waiting = asyncio.ensure_future(c.ctrl.released(NM, 5.0))
    await c.sweep()
    assert await waiting
    assert "unschedulable" not in c.node("mine")["spec"]
    assert marks(c, "mine") == {}
    assert c.node("theirs")["spec"]["unschedulable"] is True  # theirs to lift
    assert marks(c, "theirs") == {}
    assert c.node("other")["spec"]["unschedulable"] is True  # another maintenance's
    c.finish()
    assert c.api.obj(NODEMAINTENANCES.path(name=NM)) is None
    assert NM not in c.ctrl.index.spec_nodes


async def test_a_node_taken_out_of_the_spec_is_released_at_once(c: Cluster) -> None:
    for n in ("n1", "n2"):
        c.add_node(n)
    c.add_nm("n1", "n2", maxConcurrent=2)
    await c.sweep()
    assert marks(c, "n2") == {DRAINING: NM, CORDONED_BY: NM}
    edited = c.nm()
    edited["spec"]["nodes"] = ["n1"]
    c.api.put(NODEMAINTENANCES.path(name=NM), edited)
    await c.sweep()
    assert marks(c, "n2") == {} and "unschedulable" not in c.node("n2")["spec"]
    assert c.node("n1")["spec"]["unschedulable"] is True
    assert not await c.ctrl.released(NM, 0.01)  # still alive: kopf keeps the finalizer


async def test_the_deletion_handler_waits_for_the_release(
    c: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = kopfwire.registry(c.api, c.ctrl)
    (handler,) = [h for h in reg._changing.get_all_handlers() if h.id == kopfwire.HANDLER_RELEASE]
    assert handler.requires_finalizer
    c.add_node("n1")
    c.add_nm("n1")
    await c.sweep()
    await c.api.delete(NODEMAINTENANCES.path(name=NM))
    monkeypatch.setattr(c.ctrl.queue, "add", lambda _key: None)  # nobody reconciles
    fn: Any = handler.fn
    with pytest.raises(kopf.TemporaryError):
        await fn(name=NM)


def test_kopf_watches_only_nodemaintenances_with_pilotfish_settings() -> None:
    reg = kopfwire.registry(FakeApi(), None)  # type: ignore[arg-type]
    selectors = {
        (h.selector.group, h.selector.plural)
        for h in [*reg._watching.get_all_handlers(), *reg._changing.get_all_handlers()]
        if h.selector is not None
    }
    assert selectors == {(names.GROUP, "nodemaintenances")}
    assert reg is not kopf.get_default_registry()
    assert not kopf.get_default_registry()._watching.get_all_handlers()
    s = kopfwire.settings()
    assert s.persistence.finalizer == names.FINALIZER_MAINTENANCE
    assert not s.posting.enabled and s.peering.standalone and s.scanning.disabled
    progress = s.persistence.progress_storage
    assert isinstance(progress, kopf.AnnotationsProgressStorage)
    assert progress.prefix == kopfwire.ANNOTATION_PREFIX


async def test_kill_9_between_writes_converges_and_evicts_each_pod_once() -> None:
    api = FakeApi()
    first = await start(api)
    for n in ("n1", "n2"):
        first.add_node(n)
        for i in range(2):
            first.add_pod(f"{n}-p{i}", n)
    first.add_nm("n1", "n2")
    await api.settle()
    # The first process cordons n1 and evicts one pod; the second eviction's answer is lost
    # (it happened) and the process dies before its status write.
    api.fail_next("POST", "/eviction", 500, commit_first=True)
    api.fail_next("PATCH", f"{NODEMAINTENANCES.path(name=NM)}/status", 503)
    first.feed()
    with pytest.raises(Exception, match="503"):
        await first.ctrl.reconcile(NM)
    await first.stop()
    assert c_evicted(api) == ["n1-p0", "n1-p1"]

    second = await start(api)
    await second.sweep()
    assert second.node_states() == {"n1": "Drained", "n2": "Drained"}
    assert sorted(c_evicted(api)) == ["n1-p0", "n1-p1", "n2-p0", "n2-p1"]
    cordons = [w for w in api.writes("/nodes/n1") if w.method == "PATCH"]
    assert len(cordons) == 1  # the restarted process read the cordon back from the node
    await second.stop()


def c_evicted(api: FakeApi) -> list[str]:
    return [w.path.split("/")[-2] for w in api.writes("/eviction")]


def test_patches_and_refusals_parse() -> None:
    node: dict[str, Any] = {"metadata": {"name": "n", "resourceVersion": "5"}, "spec": {}}
    assert apply.cordon_patch(node, NM, True)[1:] == [
        {"op": "add", "path": "/metadata/annotations", "value": {DRAINING: NM, CORDONED_BY: NM}},
        {"op": "add", "path": "/spec/unschedulable", "value": True},
    ]
    node["metadata"]["annotations"] = {DRAINING: NM}
    assert apply.release_patch(node, "someone-else") is None
    ops = apply.release_patch(node, NM)
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
        {"op": "remove", "path": "/metadata/annotations/pilotfish.io~1draining"},
    ]
    refusal = apply.refusal_of(ApiError(429, "TooManyRequests", "x", eviction_refused("db")), NS)
    assert refusal.budget == f"{NS}/db"
    bare = apply.refusal_of(ApiError(429, "TooManyRequests", "budget not yet computed"), NS)
    assert bare.budget is None and "not yet computed" in bare.message
    body = apply.eviction(PodRef(NS, "a", "u1", "n"))
    assert body["kind"] == "Eviction" and body["deleteOptions"]["preconditions"] == {"uid": "u1"}
    assert maintenance("n")["metadata"]["finalizers"] == [names.FINALIZER_MAINTENANCE]
    assert PODS.path(NS, "a", "eviction").endswith("/pods/a/eviction")


def self_signed(where: Path) -> tuple[Path, Path]:
    """A certificate and its key, enough for the client to build its TLS context."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "op")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    crt, pem = where / "op.crt", where / "op.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return crt, pem


@pytest.mark.parametrize("identity", ["token", "certificate"])
async def test_kopf_logs_in_as_the_process_does(tmp_path: Path, identity: str) -> None:
    ca, key = self_signed(tmp_path)
    if identity == "token":
        creds: dict[str, Any] = {"token": "s3cret"}
    else:
        creds = {"client_cert": ca, "client_key": key}
    path = kubeconfig.write(tmp_path / "op.yaml", "https://127.0.0.1:6443", ca, "op", **creds)
    client = await api_client(str(path))
    try:
        info = await kopfwire.connection(Rest(client))
    finally:
        await client.close()
    assert info.server == "https://127.0.0.1:6443" and info.ca_path == str(ca)
    assert not info.insecure
    if identity == "token":
        assert (info.scheme, info.token) == ("Bearer", "s3cret")
        assert info.certificate_path is None
    else:
        assert info.token is None
        assert info.certificate_path == str(ca) and info.private_key_path == str(key)
