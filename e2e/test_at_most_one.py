"""At-most-one ServiceWorkloads on machines that go silent, against the real control plane.

Two partition-and-heal trials run side by side, each on a zone of this module's own (one
silent node per zone, so no zone brake is involved), while a sampler lists the workloads'
pods every 0.5 s:

- `early`: the node comes back before the release (its pod was waiting for the lease to
  expire): the old pod simply keeps running, under its epoch, and nothing replaces it;
- `late`: the node stays silent past the lease plus the margin: the replacement is created
  no earlier than 55 s after the node's last lease renewal, with a higher epoch, bound on the
  zone's other node; then the node returns, empty.

In no sample are there two Running copies (phase Running, no deletionTimestamp) of either.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import pytest
from kubernetes import client as k8s

from e2e.conftest import Env, wait_until
from e2e.lostnodes import fault_zone, lease_renew_time, restore, silence
from e2e.test_serviceworkload import condition, create_sw, get_sw, ns, template, workload
from pilotfish import names
from pilotfish.nodesilence import SilenceSettings
from pilotfish.workloads import LABEL_WORKLOAD

__all__ = ["ns"]  # the fixture: a namespace whose team may run production pods

pytestmark = [pytest.mark.e2e, pytest.mark.lostnodes]

EARLY_ZONE: Final = "e2e-amo-a"
LATE_ZONE: Final = "e2e-amo-b"
SAMPLE_EVERY: Final = 0.5
RELEASE_AFTER: Final = SilenceSettings().at_most_one_release_after  # the operator's defaults


def running(pod: k8s.V1Pod) -> bool:
    return pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None


def epoch(pod: k8s.V1Pod) -> int:
    return int((pod.metadata.annotations or {})[names.ANNOTATION_EPOCH])


@dataclass
class Sampler:
    """Every 0.5 s, the Running copies of each workload; the worst sample is kept."""

    env: Env
    namespace: str
    worst: dict[str, list[str]] = field(default_factory=dict)
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        core = k8s.CoreV1Api(self.env.api)
        while not self.stop.is_set():
            began = time.monotonic()
            pods = core.list_namespaced_pod(self.namespace, label_selector=LABEL_WORKLOAD).items
            copies: dict[str, list[str]] = {}
            for p in pods:
                if running(p):
                    copies.setdefault(p.metadata.labels[LABEL_WORKLOAD], []).append(p.metadata.name)
            for name, found in copies.items():
                if len(found) > len(self.worst.get(name, [])):
                    self.worst[name] = found
            self.samples += 1
            self.stop.wait(max(0.0, SAMPLE_EVERY - (time.monotonic() - began)))

    @contextlib.contextmanager
    def running(self) -> Iterator[Sampler]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            thread.join(timeout=10)


def pods_of(env: Env, namespace: str, name: str) -> list[k8s.V1Pod]:
    selector = f"{LABEL_WORKLOAD}={name}"
    return list(
        k8s.CoreV1Api(env.api).list_namespaced_pod(namespace, label_selector=selector).items
    )


def the_running_pod(env: Env, namespace: str, name: str) -> k8s.V1Pod | None:
    found = [p for p in pods_of(env, namespace, name) if running(p)]
    return found[0] if len(found) == 1 else None


def reason(env: Env, namespace: str, name: str) -> str | None:
    return condition(get_sw(env, namespace, name), "AtMostOne").get("reason")


def renewed_at(env: Env, node: str) -> datetime.datetime:
    value = lease_renew_time(env, node)
    assert isinstance(value, datetime.datetime), value
    return value


def test_an_at_most_one_pod_is_never_run_twice_across_partitions(env: Env, ns: str) -> None:
    env.require_local()
    with (
        fault_zone(env, EARLY_ZONE, 1) as early_nodes,
        fault_zone(env, LATE_ZONE, 2) as late_nodes,
    ):
        for name, zone in (("early", EARLY_ZONE), ("late", LATE_ZONE)):
            tpl = template(nodeSelector={names.LABEL_ZONE: zone})
            create_sw(env, ns, workload(name, ns, 1, atMostOne=True, template=tpl))
        early = wait_until("early running", lambda: the_running_pod(env, ns, "early"), 90)
        late = wait_until("late running", lambda: the_running_pod(env, ns, "late"), 90)
        assert (epoch(early), epoch(late)) == (1, 1)
        late_node = late.spec.node_name
        other = next(n for n in late_nodes if n != late_node)
        silenced = [early_nodes[0], late_node]

        with Sampler(env, ns).running() as sampler:
            try:
                for node in silenced:
                    silence(env, node)

                # early: waiting for the lease, then the machine returns before the release.
                wait_until(
                    "early waits for its lease to expire",
                    lambda: reason(env, ns, "early") == "WaitingForLeaseExpiry",
                    timeout=90,
                )
                message = condition(get_sw(env, ns, "early"), "AtMostOne")["message"]
                assert f"on node {early_nodes[0]}" in message and "releases at about" in message
                restore(env, early_nodes[0])
                wait_until(
                    "early holds its identity again",
                    lambda: reason(env, ns, "early") == "Held",
                    timeout=60,
                )

                # late: replaced once the lease surely expired, on the zone's other node.
                replacement = wait_until(
                    "late replaced",
                    lambda: next(
                        (
                            p
                            for p in pods_of(env, ns, "late")
                            if running(p) and p.metadata.name != late.metadata.name
                        ),
                        None,
                    ),
                    timeout=150,
                )
                last_renewal = renewed_at(env, late_node)  # silent since: this is the last one
            finally:
                for node in silenced:
                    restore(env, node)

            created = replacement.metadata.creation_timestamp
            waited = (created - last_renewal).total_seconds()
            # creationTimestamp is whole seconds: allow the truncation, nothing more.
            assert waited >= RELEASE_AFTER - 1.0, f"replaced {waited:.1f}s after the last renewal"
            assert epoch(replacement) > epoch(late)
            assert replacement.spec.node_name == other

            # The silent machine comes back empty: the released pod was deleted while it was
            # away, and nothing of the workload is on it again.
            wait_until(
                f"{late_node} back and renewing",
                lambda: renewed_at(env, late_node) > last_renewal,
                timeout=60,
            )
            on_node = [
                p.metadata.name for p in pods_of(env, ns, "late") if p.spec.node_name == late_node
            ]
            assert on_node == [], on_node
            assert [p.metadata.name for p in pods_of(env, ns, "early")] == [early.metadata.name]
            assert the_running_pod(env, ns, "early") is not None
            lease = k8s.CoordinationV1Api(env.api).read_namespaced_lease("late-at-most-one", ns)
            assert lease.spec.holder_identity == replacement.metadata.name
            assert lease.metadata.annotations[names.ANNOTATION_EPOCH] == str(epoch(replacement))

        assert sampler.samples >= RELEASE_AFTER, sampler.samples  # it sampled throughout
        assert all(len(v) <= 1 for v in sampler.worst.values()), sampler.worst


def test_at_most_one_with_two_replicas_is_refused(env: Env, ns: str) -> None:
    body = workload("twice", ns, 2, atMostOne=True)
    res = env.kubectl("-n", ns, "create", "-f", "-", input=json.dumps(body), check=False)
    assert res.returncode != 0
    assert "spec.replicas" in res.stderr, res.stderr
    assert "replicas must be 0 or 1 when atMostOne is true" in res.stderr, res.stderr
