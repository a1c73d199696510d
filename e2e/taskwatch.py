"""One BatchWorkload's pods followed by one watch, from before the job exists.

The watch sees every state each pod passes through, in the API server's order (one watch
stream is ordered by resourceVersion across all its objects). The operator deletes a task
pod once its outcome is recorded, so counting outcomes afterwards from a list would miss
most of them: the watch counts them as they happen, and checks on every state it sees that
no two live pods share an index.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from e2e.conftest import Env
from pilotfish.workloads import ANNOTATION_TASK_ATTEMPT, LABEL_BATCH, LABEL_TASK_INDEX


def index_of(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["labels"][LABEL_TASK_INDEX])


def attempt_of(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(ANNOTATION_TASK_ATTEMPT, "-1"))


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def terminal(pod: dict[str, Any]) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def running(pod: dict[str, Any]) -> bool:
    """Started by kwok and not on its way out: a pod a kubelet could end."""
    return (
        phase(pod) == "Running"
        and bool(pod["spec"].get("nodeName"))
        and not pod["metadata"].get("deletionTimestamp")
    )


@dataclass(frozen=True)
class Seen:
    """One state of one pod as the watch delivered it."""

    seq: int
    at: float  # time.monotonic() when the watch delivered it
    type: str  # ADDED, MODIFIED, DELETED
    pod: dict[str, Any]

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


class TaskWatch:
    """Every state of one job's pods, from before the job exists until `stop`."""

    def __init__(self, env: Env, ns: str, job: str) -> None:
        self.core = k8s.CoreV1Api(env.api)
        self.ns, self.job = ns, job
        self.selector = f"{LABEL_BATCH}={job}"
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.latest: dict[str, dict[str, Any]] = {}  # uid -> last state, deleted ones too
        self.live: dict[int, set[str]] = {}  # index -> uids neither terminal nor deleted
        self.violations: list[str] = []  # two live pods on one index, as observed
        self.gaps = 0  # times the watch expired and had to list again (events may be lost)
        self.errors: list[str] = []  # what broke the stream (it resumes from the last version)
        self.peak = 0  # most live pods of the job at any one moment
        self.listeners: list[Callable[[Seen], None]] = []
        self.broken: list[str] = []  # what the listeners raised
        self._stop = threading.Event()
        self._seq = itertools.count()
        resp = self.core.list_namespaced_pod(ns, label_selector=self.selector)
        assert not resp.items, f"pods of {job} exist before the test made it"
        self._rv: str = resp.metadata.resource_version
        self._thread = threading.Thread(target=self._run, name=f"watch-{job}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
            except ApiException as e:
                if e.status == 410:  # compacted: list again, and say so (`gaps`)
                    self._relist()
                    continue
                with self.lock:
                    self.errors.append(repr(e))
                self._stop.wait(0.2)
            except Exception as e:  # a dropped connection: resume from the last version seen
                with self.lock:
                    self.errors.append(repr(e))
                self._stop.wait(0.2)

    def _relist(self) -> None:
        with self.lock:
            self.gaps += 1
        resp = self.core.list_namespaced_pod(self.ns, label_selector=self.selector)
        for p in resp.items:
            self._apply("MODIFIED", k8s.ApiClient().sanitize_for_serialization(p))
        self._rv = resp.metadata.resource_version

    def _watch_once(self) -> None:
        resp = self.core.list_namespaced_pod(
            self.ns,
            label_selector=self.selector,
            watch=True,
            resource_version=self._rv,
            allow_watch_bookmarks=True,
            timeout_seconds=5,
            _preload_content=False,
            _request_timeout=30,
        )
        try:
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message"))
                self._rv = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    self._apply(event["type"], obj)
                if self._stop.is_set():
                    return
        finally:
            resp.release_conn()

    def _apply(self, type_: str, pod: dict[str, Any]) -> None:
        seen = Seen(next(self._seq), time.monotonic(), type_, pod)
        uid, index = seen.uid, index_of(pod)
        with self.lock:
            self.seen.append(seen)
            self.latest[uid] = pod
            uids = self.live.setdefault(index, set())
            if type_ == "DELETED" or terminal(pod):
                uids.discard(uid)
            else:
                uids.add(uid)
            self.peak = max(self.peak, sum(len(u) for u in self.live.values()))
            if len(uids) > 1:
                others = sorted(self.latest[u]["metadata"]["name"] for u in uids)
                self.violations.append(
                    f"index {index} has {len(uids)} live pods at resourceVersion "
                    f"{pod['metadata']['resourceVersion']}: {others}"
                )
        for listener in self.listeners:
            try:
                listener(seen)
            except Exception as e:  # the test's own code: fail the test, not the watch
                with self.lock:
                    self.broken.append(f"{seen.name}: {e!r}")

    # reading back

    def events(self) -> list[Seen]:
        with self.lock:
            return list(self.seen)

    def pods(self) -> list[dict[str, Any]]:
        """Every pod seen, in the order they were first seen, as last seen."""
        with self.lock:
            order = list(dict.fromkeys(s.uid for s in self.seen))
            return [self.latest[u] for u in order]

    def of_index(self, index: int) -> list[dict[str, Any]]:
        return [p for p in self.pods() if index_of(p) == index]

    def history(self, index: int) -> list[str]:
        """Each state of the index's pods seen, for failure messages."""
        out = []
        for s in self.events():
            if index_of(s.pod) == index:
                meta, st = s.pod["metadata"], s.pod.get("status") or {}
                conds = [c["type"] for c in st.get("conditions") or [] if c.get("status") == "True"]
                deleting = " deleting" if meta.get("deletionTimestamp") else ""
                out.append(f"{s.type} {meta['name']} {phase(s.pod)}{deleting} {conds}")
        return out

    def live_pods(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self.latest[u] for uids in self.live.values() for u in uids]

    def outcomes(self, wanted: str) -> Counter[int]:
        """Per index, how many distinct pods were ever seen in phase `wanted`."""
        with self.lock:
            uids = {s.uid: index_of(s.pod) for s in self.seen if phase(s.pod) == wanted}
        return Counter(uids.values())

    def first(self, uid: str, check: Callable[[dict[str, Any]], bool]) -> Seen | None:
        """The first state of pod `uid` for which `check` holds."""
        return next((s for s in self.events() if s.uid == uid and check(s.pod)), None)
