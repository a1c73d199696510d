"""A node-failure recording taken from an e2e test (`benchmarks.probes.nodefailure` reads
it): the failure timings are 40 s and 60 s, so a test samples the cluster in the background
while several scenarios run their course, then asserts on what the samples show."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Final

from kubernetes import client as k8s

from benchmarks.probes import nodefailure as nf
from e2e.conftest import Env, wait_until
from pilotfish import names

SAMPLE_EVERY: Final = 0.5


def items(resp: Any) -> list[dict[str, Any]]:
    """The items of a list answered with `_preload_content=False` (raw JSON, camelCase, no
    model objects: a sample every half second stays cheap)."""
    found: list[dict[str, Any]] = json.loads(resp.data).get("items") or []
    return found


class Recorder:
    """Samples the nodes of `zones`, every node lease, and the pods and EndpointSlices of
    `namespace` every SAMPLE_EVERY seconds, in a thread (started and stopped as a context
    manager, or `stop`)."""

    def __init__(self, env: Env, namespace: str, zones: list[str]) -> None:
        self.core = k8s.CoreV1Api(env.api)
        self.coord = k8s.CoordinationV1Api(env.api)
        self.discovery = k8s.DiscoveryV1Api(env.api)
        self.namespace = namespace
        self.selector = f"{names.LABEL_ZONE} in ({','.join(zones)})"
        self.samples: list[nf.Sample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-failure-recorder")

    def take(self) -> nf.Sample:
        at = time.time()
        raw: dict[str, Any] = {"_preload_content": False, "_request_timeout": 10}
        nodes = items(self.core.list_node(label_selector=self.selector, **raw))
        leases = items(self.coord.list_namespaced_lease("kube-node-lease", **raw))
        pods = items(self.core.list_namespaced_pod(self.namespace, **raw))
        slices = items(self.discovery.list_namespaced_endpoint_slice(self.namespace, **raw))
        return nf.sample(at, time.time(), nodes, leases, pods, slices)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.samples.append(self.take())
            except Exception as e:  # a missed sample is a gap, not the end of the record
                self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(max(0.0, SAMPLE_EVERY - (time.monotonic() - started)))

    def latest(self) -> nf.Sample | None:
        return self.samples[-1] if self.samples else None

    def past(self, t: float) -> bool:
        """Whether the recording has a sample taken at `t` or later."""
        s = self.latest()
        return s is not None and s.at >= t

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def __enter__(self) -> Recorder:
        self._thread.start()
        wait_until("a first sample", self.latest, timeout=30)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
