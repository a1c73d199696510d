"""One quota ledger: room freed by a finished pod is handed out once, never twice.

Admission (the webhooks process) and the gate controller (the operator) both spend a team's
quota; they meet only in the TeamQuota, through the reservation each adds with a write
conditional on the version it decided from. Here a team at its batch limit has a pod
waiting behind the quota gate; one pod finishes while pods race through admission, and the
waiting pod and the racers compete for exactly the room that freed.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from e2e.teams import own_team
from pilotfish import gates, names

LIMIT = 4  # cores of batch; every pod here asks one
QUOTA_GATE = "gates.pilotfish.io/quota-available"


def batch_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {names.LABEL_BAND: "batch"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "example/x:1",
                    "resources": {"requests": {"cpu": "1", "memory": "16Mi"}},
                }
            ]
        },
    }


def holds_quota(p: k8s.V1Pod) -> bool:
    """What the ledger must cover: a pod neither finished, leaving, nor behind our gates."""
    if p.metadata.deletion_timestamp or p.status.phase in ("Succeeded", "Failed"):
        return False
    return not any(gates.is_pilotfish_gate(g.name) for g in p.spec.scheduling_gates or [])


class Team:
    def __init__(self, env: Env, namespace: str, name: str) -> None:
        self.core = k8s.CoreV1Api(env.api)
        self.custom = k8s.CustomObjectsApi(env.api)
        self.namespace, self.name = namespace, name

    def pods(self) -> list[k8s.V1Pod]:
        return list(self.core.list_namespaced_pod(self.namespace).items)

    def holders(self) -> list[str]:
        return sorted(p.metadata.name for p in self.pods() if holds_quota(p))

    def status(self) -> dict[str, Any]:
        tq = self.custom.get_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", self.name
        )
        return dict(tq.get("status") or {})

    def settled_at(self, cores: int) -> bool:
        """The quota controller has counted `cores` in used and owes no reservation."""
        st = self.status()
        used = (st.get("used") or {}).get("batch") or {}
        return used.get("cpu") == str(cores) and not st.get("reservations")

    def create(self, name: str) -> str:
        try:
            created = self.core.create_namespaced_pod(self.namespace, batch_pod(name))
        except ApiException as e:
            return "refused: " + str(json.loads(e.body).get("message"))
        gated = [g.name for g in created.spec.scheduling_gates or []]
        return "gated" if QUOTA_GATE in gated else "admitted"

    def finish(self, name: str) -> None:
        """What the kubelet reports when the pod's containers exit."""
        self.core.patch_namespaced_pod_status(
            name, self.namespace, {"status": {"phase": "Succeeded"}}
        )

    def running(self, name: str) -> bool:
        return bool(self.core.read_namespaced_pod(name, self.namespace).status.phase == "Running")


@pytest.fixture
def team(env: Env, namespace: str) -> Iterator[Team]:
    with own_team(env, namespace) as name:
        body = {
            "apiVersion": names.API_VERSION,
            "kind": "TeamQuota",
            "metadata": {"name": name},
            "spec": {"team": name, "bands": {"batch": {"cpu": str(LIMIT)}}},
        }
        t = Team(env, namespace, name)
        t.custom.create_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", body)

        def seen() -> bool:  # admission reads quotas from its informer
            try:
                t.core.create_namespaced_pod(namespace, batch_pod("probe"), dry_run="All")
            except ApiException as e:
                return "no batch quota" not in str(json.loads(e.body).get("message"))
            return True

        wait_until(f"TeamQuota {name} visible to admission", seen, timeout=30)
        yield t


class Watch:
    """Samples the team's pods while the race runs: quota held never above the limit."""

    def __init__(self, team: Team) -> None:
        self.team = team
        self.stop = threading.Event()
        self.worst: list[str] = []
        self.samples = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            holders = self.team.holders()
            self.samples += 1
            if len(holders) > len(self.worst):
                self.worst = holders
            self.stop.wait(0.05)  # the sampling pace, not a wait for a condition

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def race(team: Team, finishing: list[str], prefix: str, threads: int = 4) -> list[str]:
    """Finish `finishing` while `threads` creators keep submitting pods until the freed room
    is taken again; returns every creation's outcome."""
    outcomes: list[str] = []
    taken = threading.Event()

    def creator(t: int) -> None:
        for i in range(8):
            if taken.is_set():
                return
            outcomes.append(team.create(f"{prefix}-{t}-{i}"))

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for name in finishing:
            team.finish(name)
        futures = [pool.submit(creator, t) for t in range(threads)]
        wait_until(
            "the freed room taken again",
            lambda: len(team.holders()) == LIMIT,
            timeout=60,
            interval=0.1,
        )
        taken.set()
        for f in futures:
            f.result()
    return outcomes


def test_room_freed_while_admissions_race_a_release_is_handed_out_once(team: Team) -> None:
    for i in range(LIMIT):
        assert team.create(f"fill-{i}") == "admitted"
    wait_until("the team at its limit, counted", lambda: team.settled_at(LIMIT), timeout=60)
    assert team.create("waiter") == "gated", "over quota: the batch pod waits for room"

    with Watch(team) as watch:
        first = race(team, ["fill-0"], "a")
        wait_until("the ledger settled at the limit", lambda: team.settled_at(LIMIT), timeout=60)
        assert len(team.holders()) == LIMIT
        # Twice the room at once: each core still goes to one pod only.
        second = race(team, ["fill-1", "fill-2"], "b")
        wait_until("the ledger settled again", lambda: team.settled_at(LIMIT), timeout=60)
    assert watch.samples > 0
    assert len(watch.worst) <= LIMIT, f"{len(watch.worst)} pods held {LIMIT} cores: {watch.worst}"

    holders = team.holders()
    assert len(holders) == LIMIT and "fill-3" in holders, holders
    outcomes = first + second
    for o in outcomes:
        assert o in ("admitted", "gated") or "batch cpu" in o or "being updated" in o, o
    # Three cores were freed: three pods took them, admitted directly or released.
    admitted, gated = outcomes.count("admitted"), outcomes.count("gated")
    assert admitted <= 3
    released = 3 - admitted
    waiting = [p for p in team.pods() if not holds_quota(p) and p.status.phase == "Pending"]
    assert len(waiting) == 1 + gated - released, [p.metadata.name for p in waiting]
    for p in waiting:  # the rest still waits behind the quota gate, holding nothing
        assert QUOTA_GATE in [g.name for g in p.spec.scheduling_gates or []], p.metadata.name
    for name in holders:
        wait_until(
            f"{name} scheduled and running", functools.partial(team.running, name), timeout=60
        )
