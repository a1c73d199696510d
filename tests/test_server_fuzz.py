"""Malformed bodies at the running webhook and extender servers: never a 5xx, a hang or a crash.

Both servers run in-process on 127.0.0.1 exactly as `pilotfish dev up` runs them: the real
aiohttp stack with its head deadline, mutual TLS with the dev PKI, the pod reviews bound to
a GatePolicy view, bands and a team quota, the extender over a synced snapshot. They run on
an event loop of their own in a thread, so hypothesis drives them from plain tests.

Bodies are random JSON of random shapes, valid reviews and extender arguments with one field
replaced (by a value of another type, deep nesting, a huge string) or removed, truncated
JSON, random bytes, and each server's bodies sent to the other's paths. Any answer of 500 or
more fails, and so does a request unanswered within `DEADLINE` or a server task that ended.
Valid input may be allowed, denied or patched; malformed input must get a 4xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import threading
from collections.abc import Coroutine, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilotfish import httpserver
from pilotfish.extender import server as extender
from pilotfish.webhooks import quota as quota_rules
from pilotfish.webhooks import server as webhooks
from pilotfish.webhooks.gatecache import StaticViews
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.teamview import TeamSnapshot
from tests import builders
from tests.servers import client_tls, dev_pki, free_port, server_tls, wait_listening
from tests.test_extender_builders import node, pod, snapshot

T = TypeVar("T")

# Per request: far above any answer's time, far below "hangs".
DEADLINE: Final = 10.0
NOW: Final = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
NODES: Final = [f"node-{i}" for i in range(6)]
WEBHOOK_PATHS: Final = (
    "/mutate/pods",
    "/validate/pods",
    "/validate/workloads",
    "/validate/teamquotas",
)
EXTENDER_PATHS: Final = ("/filter", "/prioritize", "/preempt")
# Enough to meet every branch of the parsers many times over; the whole module stays well
# under a minute on two cores. PILOTFISH_FUZZ_EXAMPLES=20000 for a long hunt.
EXAMPLES: Final = int(os.environ.get("PILOTFISH_FUZZ_EXAMPLES", "1200"))

# --- valid seeds ---------------------------------------------------------------------------

POD: Final[dict[str, Any]] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "web-0",
        "namespace": "team-a",
        "uid": "pod-uid-1",
        "labels": {"app": "web", "pilotfish.io/band": "batch"},
        "annotations": {"note": "x"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": True}],
        "creationTimestamp": None,
    },
    "spec": {
        "containers": [
            {
                "name": "web",
                "image": "nginx",
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            }
        ],
        "initContainers": [{"name": "init", "image": "busybox", "restartPolicy": "Always"}],
        "schedulingGates": [{"name": "example.com/hold"}],
        "priority": 0,
        "tolerations": [{"key": "k", "operator": "Exists"}],
    },
}


def review(
    obj: Mapping[str, Any] | None, *, operation: str = "CREATE", pod_kind: bool = True
) -> Any:
    kind = (
        {"group": "", "version": "v1", "kind": "Pod"}
        if pod_kind
        else {"group": "pilotfish.io", "version": "v1alpha1", "kind": str((obj or {}).get("kind"))}
    )
    resource = {"group": kind["group"], "version": kind["version"], "resource": "pods"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "name": "web-0",
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"], "extra": {}},
            "object": copy.deepcopy(obj) if operation != "DELETE" else None,
            "oldObject": copy.deepcopy(obj) if operation != "CREATE" else None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def workload(kind: str) -> dict[str, Any]:
    spec = {
        "ServiceWorkload": builders.service_workload_spec,
        "BatchWorkload": builders.batch_workload_spec,
        "GatePolicy": builders.gate_policy_spec,
    }[kind]()
    return builders.obj(kind, spec)


WEBHOOK_SEEDS: Final[list[dict[str, Any]]] = [
    review(POD),
    review(POD, operation="UPDATE"),
    review(POD, operation="DELETE"),
    review({"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c"}]}}),
    *(review(workload(k), pod_kind=False) for k in ("ServiceWorkload", "BatchWorkload")),
    review(workload("GatePolicy"), pod_kind=False, operation="UPDATE"),
]

EXTENDER_SEEDS: Final[list[dict[str, Any]]] = [
    {"Pod": POD, "NodeNames": NODES},
    {"Pod": POD, "Nodes": {"items": [{"metadata": {"name": n}} for n in NODES[:3]]}},
    {
        "Pod": POD,
        "NodeNameToMetaVictims": {
            "node-0": {"Pods": [{"UID": "v-a"}, {"UID": "v-b"}], "NumPDBViolations": 0},
            "node-1": None,
        },
    },
    {"Pod": POD, "NodeNameToVictims": {"node-0": {"Pods": [{"metadata": {"uid": "v-a"}}]}}},
]

# --- bodies --------------------------------------------------------------------------------

_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", "0", "-1", "500m", "1e3", "1Gi", "Pod", "CREATE", "node-0", "v-a"])
)
JSON: Final = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Stands for a value spliced in as raw text (deep nesting, a huge string) after encoding.
_SPLICE: Final = "\x00splice\x00"


def positions(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place inside `value` a field or an item sits at."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*at, key)
            yield from positions(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (*at, i)
            yield from positions(item, (*at, i))


def _replaced(seed: Any, where: tuple[Any, ...], new: Any, *, remove: bool = False) -> Any:
    out = copy.deepcopy(seed)
    parent = out
    for step in where[:-1]:
        parent = parent[step]
    if remove:
        del parent[where[-1]]
    else:
        parent[where[-1]] = new
    return out


@st.composite
def spliced(draw: st.DrawFn) -> str:
    """Raw JSON text of a value too deep or too big to build as a Python object cheaply."""
    depth = draw(st.integers(min_value=1, max_value=3000))
    open_, close = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    if draw(st.booleans()):
        return open_ * depth + ("1" if open_ == '{"a":' else "") + close * depth
    size = draw(st.sampled_from([1_000, 100_000, 1_000_000]))
    return json.dumps(draw(st.sampled_from(["x", "\u00e9", "\\", '"'])) * size)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Any]) -> bytes:
    """A valid body with one field replaced by another type or shape, or removed."""
    seed = draw(st.sampled_from(seeds))
    where = draw(st.sampled_from(list(positions(seed))))
    action = draw(st.sampled_from(["json", "json", "json", "remove", "splice"]))
    if action == "remove":
        return json.dumps(_replaced(seed, where, None, remove=True)).encode()
    if action == "splice":
        text = json.dumps(_replaced(seed, where, _SPLICE))
        return text.replace(json.dumps(_SPLICE), draw(spliced()), 1).encode()
    return json.dumps(_replaced(seed, where, draw(JSON))).encode()


@st.composite
def truncated(draw: st.DrawFn, seeds: list[Any]) -> bytes:
    raw = json.dumps(draw(st.sampled_from(seeds))).encode()
    return raw[: draw(st.integers(min_value=0, max_value=len(raw) - 1))]


def bodies(own: list[Any], other: list[Any]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        mutated(own),
        mutated(own),
        mutated(own),
        truncated(own),
        JSON.map(lambda v: json.dumps(v).encode()),
        spliced().map(str.encode),
        st.binary(max_size=64),
        st.sampled_from(other).map(lambda v: json.dumps(v).encode()),
        st.sampled_from(own).map(lambda v: json.dumps(v).encode()),
    )


# --- the servers ---------------------------------------------------------------------------


class Teams:
    """A team view with one namespace, one TeamQuota and reservations that always succeed."""

    def __init__(self) -> None:
        tq = {
            "metadata": {"name": "payments", "generation": 2, "resourceVersion": "7"},
            "spec": {
                "team": "payments",
                "bands": {b: {"cpu": "100", "memory": "400Gi"} for b in ("production", "batch")},
            },
            "status": {"used": {"batch": {"cpu": "99"}}},
        }
        self.team = TeamSnapshot({"team-a": {"pilotfish.io/team": "payments"}}, (tq,))
        self.reserved = 0

    def snapshot(self) -> TeamSnapshot:
        return self.team

    async def reserve(
        self,
        pod: Mapping[str, Any],
        namespace_labels: Mapping[str, str],
        band: str,
        first: quota_rules.Admit,
        now: datetime,
    ) -> str | None:
        self.reserved += 1
        return None


class Stack:
    """Both servers on an event loop in a thread, and a mutual-TLS client session there."""

    def __init__(self, root: Path) -> None:
        self.certs = dev_pki(root)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.tasks: list[asyncio.Task[None]] = []
        self.ports: dict[str, int] = {}
        self.session: aiohttp.ClientSession | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = DEADLINE + 5) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        policy = builders.obj("GatePolicy", builders.gate_policy_spec())
        policy["metadata"] = {"name": "hold", "namespace": "team-a", "generation": 1}
        reviews = webhooks.bind_reviews(
            StaticViews(GateView.from_objects([policy])),
            clock=lambda: NOW,
            teams=Teams(),
            scheduler_name="pilotfish-scheduler",
        )
        snap = snapshot(
            [node(name, f"zone-{i % 3}") for i, name in enumerate(NODES)],
            [pod(f"v-{u}", node="node-0", uid=f"v-{u}", band="batch") for u in "abc"],
        )
        tls = extender.Tls(
            str(self.certs.cert("extender")),
            str(self.certs.key("extender")),
            str(self.certs.ca_cert),
        )
        starts: dict[str, Any] = {
            "webhooks": lambda port: httpserver.run_until_cancelled(
                webhooks.make_app(reviews),
                "127.0.0.1",
                port,
                name="webhooks",
                ssl_context=server_tls(self.certs, "webhooks"),
            ),
            "extender": lambda port: extender.serve_snapshot("127.0.0.1", port, snap, tls=tls),
        }
        for name, start in starts.items():
            port = free_port()
            task: asyncio.Task[None] = asyncio.ensure_future(start(port))
            await wait_listening(task, port)
            self.tasks.append(task)
            self.ports[name] = port
        connector = aiohttp.TCPConnector(ssl=client_tls(self.certs), limit=4)
        self.session = aiohttp.ClientSession(connector=connector)

    async def _stop(self) -> None:
        if self.session is not None:
            await self.session.close()
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def __enter__(self) -> Stack:
        self.thread.start()
        self.run(self._start())
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()

    async def _post(self, url: str, body: bytes, method: str) -> tuple[int, str]:
        assert self.session is not None
        async with asyncio.timeout(DEADLINE):
            async with self.session.request(
                method, url, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                return resp.status, await resp.text()

    def send(self, server: str, path: str, body: bytes, method: str = "POST") -> tuple[int, str]:
        """The status and text of one call; fails on a hang or a dead server."""
        for task in self.tasks:
            assert not task.done(), f"a server task ended: {task!r}"
        url = f"https://127.0.0.1:{self.ports[server]}{path}"
        try:
            return self.run(self._post(url, body, method))
        except TimeoutError:
            pytest.fail(f"{server} {path}: no answer within {DEADLINE} s to {body[:200]!r}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("pki")) as running:
        yield running


def assert_below_500(server: str, path: str, body: bytes, answer: tuple[int, str]) -> None:
    status, text = answer
    assert status < 500, f"{server} {path} answered {status} {text!r} to {body[:300]!r}"


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_the_seeds_are_valid(stack: Stack) -> None:
    """The fuzzing starts from bodies the servers accept, so mutations probe past parsing."""
    for seed in WEBHOOK_SEEDS:
        for path in WEBHOOK_PATHS:
            status, text = stack.send("webhooks", path, json.dumps(seed).encode())
            assert status == 200, (path, text)
    for seed in EXTENDER_SEEDS:
        placing = "NodeNames" in seed or "Nodes" in seed
        for path in ("/filter", "/prioritize") if placing else ("/preempt",):
            status, text = stack.send("extender", path, json.dumps(seed).encode())
            assert status == 200, (path, text)


@FUZZ
@given(path=st.sampled_from(WEBHOOK_PATHS), body=bodies(WEBHOOK_SEEDS, EXTENDER_SEEDS))
def test_webhooks_never_answer_5xx(stack: Stack, path: str, body: bytes) -> None:
    assert_below_500("webhooks", path, body, stack.send("webhooks", path, body))


@FUZZ
@given(path=st.sampled_from(EXTENDER_PATHS), body=bodies(EXTENDER_SEEDS, WEBHOOK_SEEDS))
def test_extender_never_answers_5xx(stack: Stack, path: str, body: bytes) -> None:
    assert_below_500("extender", path, body, stack.send("extender", path, body))


@settings(max_examples=150, deadline=None)
@given(
    server=st.sampled_from(["webhooks", "extender"]),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
    path=st.sampled_from([*WEBHOOK_PATHS, *EXTENDER_PATHS, "/healthz", "/readyz", "/metrics"])
    | st.text(alphabet="/abcz%.-_?=&", max_size=20).map(lambda p: "/" + p),
    body=st.binary(max_size=32),
)
def test_every_path_and_method_answers_below_500(
    stack: Stack, server: str, method: str, path: str, body: bytes
) -> None:
    assert_below_500(server, path, body, stack.send(server, path, body, method))


def test_the_servers_are_still_healthy_after_the_fuzzing(stack: Stack) -> None:
    for server in ("webhooks", "extender"):
        assert stack.send(server, "/healthz", b"", "GET") == (200, "ok")
