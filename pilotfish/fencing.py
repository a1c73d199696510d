"""Fencing for an at-most-one holder: writes carry the holder's epoch, and a stale one is refused.

The ServiceWorkload controller never runs two copies of an at-most-one pod on purpose, but a
copy it gave up on (its node went silent, then came back; a process paused for minutes) may
still run for a while and write. Every replacement gets a strictly higher epoch
(annotation `pilotfish.io/epoch` on the pod, env `PILOTFISH_EPOCH` through the downward API),
so the resources it writes can tell the copies apart: an object labelled
`pilotfish.io/fenced: "true"` carries the epoch of its last writer in its own
`pilotfish.io/epoch` annotation, and a write with a lower one is refused. Two guards, each
enough on its own:

- `Fenced.update` reads the object, refuses locally if it already carries a newer epoch, and
  writes with the resourceVersion it read (a conditional update), so a newer holder's write
  between the read and the write makes it read again (read, check, compare-and-swap);
- the chart's ValidatingAdmissionPolicy `pilotfish-fencing` makes the API server refuse any
  update of a fenced object whose epoch is missing, not an integer or lower than the stored
  one, whoever sends it and however (`kubectl edit`, a blind PUT: `Fenced.put`).

Deletes are not fenced (a DELETE carries no epoch): clear a fenced object with an update.

`SelfFence` is the holder's side of the same rule for a holder that renews a lease itself:
it stops 30 s after the last renewal it *sent* (ARCHITECTURE section 9).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pilotfish import names

ANNOTATION_EPOCH: Final = names.ANNOTATION_EPOCH
LABEL_FENCED: Final = "pilotfish.io/fenced"
ENV_EPOCH: Final = "PILOTFISH_EPOCH"
POLICY: Final = "pilotfish-fencing"
# Digits only, at most 18 so the admission policy's CEL int() never overflows int64.
EPOCH_PATTERN: Final = "^[0-9]{1,18}$"
EPOCH_RULE: Final = "an epoch is a decimal integer of 1 to 18 digits"
# The policy's words (charts/pilotfish/templates/fencing-policy.yaml quotes them).
RULE: Final = (
    f"an object labelled {LABEL_FENCED}=true stays labelled and is written only with an integer "
    f"{ANNOTATION_EPOCH} annotation no lower than the one it carries (a lower one is a stale "
    "holder's write)"
)
# StaleEpoch.refused_by when the object read already carries a newer epoch.
READ: Final = "read"
# The agent-side rule: a holder stops this long after the last renewal it sent.
HOLD_SECONDS: Final = 30.0

_EPOCH_RE: Final = re.compile("[0-9]{1,18}")

Obj = dict[str, Any]


class FencingError(Exception):
    """Base of this module's errors."""


class NoEpoch(FencingError, ValueError):
    """This process has no usable epoch (PILOTFISH_EPOCH unset or malformed)."""


@dataclass(frozen=True)
class Ref:
    """A namespaced object: ConfigMaps in the core group, anything else by group/version/plural."""

    group: str
    version: str
    plural: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def configmap(cls, namespace: str, name: str) -> Ref:
        return cls("", "v1", "configmaps", "ConfigMap", namespace, name)

    @classmethod
    def lease(cls, namespace: str, name: str) -> Ref:
        return cls("coordination.k8s.io", "v1", "leases", "Lease", namespace, name)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        kind = f"{self.plural}.{self.group}" if self.group else self.plural
        return f"{kind} {self.namespace}/{self.name}"


class StaleEpoch(FencingError):
    """A write refused because the object carries a newer epoch than ours: another holder has
    taken over, and this copy must stop."""

    def __init__(self, ref: Ref, theirs: int | None, ours: int, refused_by: str, detail: str):
        """`refused_by`: READ (this library, before writing) or the admission policy."""
        self.ref, self.theirs, self.ours, self.refused_by = ref, theirs, ours, refused_by
        shown = "an unknown epoch" if theirs is None else f"epoch {theirs}"
        how = "not written" if refused_by == READ else f"refused by {refused_by}"
        super().__init__(f"{ref} carries {shown}, newer than ours ({ours}): {how}: {detail}")


class ApiRefusal(Exception):
    """The API server answered a write with an error (status, message as it gave them)."""

    def __init__(self, status: int, message: str):
        self.status, self.message = status, message
        super().__init__(f"{status}: {message}")


class Transport(Protocol):
    """The three calls fencing makes; `KubeTransport` speaks them to an API server."""

    def get(self, ref: Ref) -> Obj | None: ...

    def create(self, ref: Ref, body: Obj) -> Obj: ...

    def replace(self, ref: Ref, body: Obj) -> Obj: ...


def parse_epoch(value: object) -> int | None:
    """The epoch a string holds, or None when it is not one (`EPOCH_RULE`)."""
    if not isinstance(value, str) or _EPOCH_RE.fullmatch(value) is None:
        return None
    return int(value)


def epoch_from_env(environ: Mapping[str, str] | None = None) -> int:
    """This process's epoch, from PILOTFISH_EPOCH (the pod's annotation via the downward API)."""
    raw = (os.environ if environ is None else environ).get(ENV_EPOCH)
    if raw is None:
        raise NoEpoch(
            f"{ENV_EPOCH} is not set: only at-most-one pods (ServiceWorkload atMostOne: true) "
            "get an epoch"
        )
    epoch = parse_epoch(raw)
    if epoch is None:
        raise NoEpoch(f"{ENV_EPOCH}={raw!r}: {EPOCH_RULE}")
    return epoch


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _strings(meta: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = meta.get(key)
    return value if isinstance(value, Mapping) else {}


def epoch_of(obj: Mapping[str, Any] | None) -> int | None:
    """The epoch an object's `pilotfish.io/epoch` annotation holds (None: none, or not one)."""
    return parse_epoch(_strings(_meta(obj), "annotations").get(ANNOTATION_EPOCH))


def is_fenced(obj: Mapping[str, Any] | None) -> bool:
    return _strings(_meta(obj), "labels").get(LABEL_FENCED) == "true"


def refusal(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> str | None:
    """Why the fencing policy refuses writing `new` over `old` (None: it admits it).

    The chart's policy in Python (tests hold them to each other); `old` is None for a create.
    """
    if is_fenced(old) and not is_fenced(new):
        return f"label {LABEL_FENCED} removed"
    if not is_fenced(new):
        return None
    raw = _strings(_meta(new), "annotations").get(ANNOTATION_EPOCH)
    if raw is None:
        return f"annotation {ANNOTATION_EPOCH} missing"
    ours = parse_epoch(raw)
    if ours is None:
        return f"annotation {ANNOTATION_EPOCH} {raw!r} is not an integer"
    theirs = epoch_of(old)
    if theirs is not None and ours < theirs:
        return f"annotation {ANNOTATION_EPOCH} {ours} is lower than the object's {theirs}"
    return None


def stamped(body: Mapping[str, Any], epoch: int) -> Obj:
    """A copy of `body` labelled fenced and carrying `epoch`."""
    out = copy.deepcopy(dict(body))
    meta = out.setdefault("metadata", {})
    meta.setdefault("labels", {})[LABEL_FENCED] = "true"
    meta.setdefault("annotations", {})[ANNOTATION_EPOCH] = str(epoch)
    return out


class Fenced:
    """Writes to one object as the holder of `epoch` (default: this pod's, `epoch_from_env`).

    `Fenced.of(kubernetes.client.ApiClient(), Ref.configmap("team-a", "shards"))`.
    """

    def __init__(
        self, transport: Transport, ref: Ref, epoch: int | None = None, *, attempts: int = 5
    ) -> None:
        self.transport = transport
        self.ref = ref
        self.epoch = epoch_from_env() if epoch is None else epoch
        self.attempts = attempts

    @classmethod
    def of(cls, api: Any, ref: Ref, epoch: int | None = None) -> Fenced:
        """Over a synchronous `kubernetes.client.ApiClient`."""
        return cls(KubeTransport(api), ref, epoch)

    def read(self) -> Obj | None:
        return self.transport.get(self.ref)

    def update(self, change: Callable[[Obj], None]) -> Obj:
        """Read, refuse if the object is newer than us, `change` it in place, write it back
        conditionally (created, fenced, if it does not exist); again on a conflict."""
        for _ in range(self.attempts):
            current = self.read()
            if current is not None:
                self._check(current)
                body = stamped(current, self.epoch)
                change(body)
                body = stamped(body, self.epoch)  # `change` may not take the fence off
                try:
                    return self._write(self.transport.replace, body)
                except ApiRefusal as e:
                    if e.status == 409:
                        continue
                    raise
            body = {"apiVersion": self.ref.api_version, "kind": self.ref.kind, "metadata": {}}
            change(body)
            body = stamped(body, self.epoch)
            body["metadata"].update(name=self.ref.name, namespace=self.ref.namespace)
            try:
                return self._write(self.transport.create, body)
            except ApiRefusal as e:
                if e.status == 409:  # created meanwhile: read it and go again
                    continue
                raise
        raise FencingError(f"{self.ref}: still conflicting after {self.attempts} attempts")

    def put(self, body: Mapping[str, Any]) -> Obj:
        """Write the whole object as of our epoch without reading it first (no
        resourceVersion): the API server's fencing policy alone judges it. For a ConfigMap the
        holder rewrites whole (a shard map) where the chart is installed; the API server takes
        such unconditional updates for ConfigMaps only (not Leases, not custom resources)."""
        if (self.ref.group, self.ref.plural) != ("", "configmaps"):
            raise ValueError(
                f"{self.ref}: put is for ConfigMaps only (the API server requires a "
                "resourceVersion to update anything else): use update"
            )
        out = stamped(
            {"apiVersion": self.ref.api_version, "kind": self.ref.kind, **body}, self.epoch
        )
        out["metadata"].pop("resourceVersion", None)
        out["metadata"].update(name=self.ref.name, namespace=self.ref.namespace)
        return self._write(self.transport.replace, out)

    def _check(self, current: Mapping[str, Any]) -> None:
        theirs = epoch_of(current)
        if theirs is not None and theirs > self.epoch:
            raise StaleEpoch(
                self.ref, theirs, self.epoch, READ, "a newer holder has written it since"
            )

    def _write(self, call: Callable[[Ref, Obj], Obj], body: Obj) -> Obj:
        try:
            return call(self.ref, body)
        except ApiRefusal as e:
            if e.status in (403, 422) and POLICY in e.message:
                theirs: int | None = None
                with contextlib.suppress(ApiRefusal):
                    theirs = epoch_of(self.read())
                raise StaleEpoch(
                    self.ref, theirs, self.epoch, f"admission policy {POLICY}", e.message
                ) from e
            raise


def lease_holder(holder: str, duration_seconds: int, now: str) -> Callable[[Obj], None]:
    """A `Fenced.update` change taking a Lease used as a lock: holder, renewal at `now`
    (RFC 3339 with microseconds, `timeutil.format_micro_time`), duration; a new holder
    counts a transition and its acquireTime."""

    def change(lease: Obj) -> None:
        spec = lease.setdefault("spec", {})
        if spec.get("holderIdentity") != holder:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = now
        spec.update(holderIdentity=holder, leaseDurationSeconds=duration_seconds, renewTime=now)

    return change


class KubeTransport:
    """`Transport` over a synchronous `kubernetes.client.ApiClient`: ConfigMaps through the
    core API, every other resource through the generic custom-objects paths (which serve any
    group, built-in ones too)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Obj:
        from kubernetes.client.exceptions import ApiException

        try:
            res = fn(*args, _preload_content=False)
        except ApiException as e:
            message = str(e.reason or "")
            with contextlib.suppress(ValueError, TypeError):
                message = str(json.loads(e.body).get("message") or message)
            raise ApiRefusal(int(e.status or 0), message) from None
        data = json.loads(res.data)
        if not isinstance(data, dict):
            raise FencingError(f"unexpected answer: {data!r}")
        return data

    def _args(self, ref: Ref) -> tuple[str, ...]:
        if ref.group:
            return (ref.group, ref.version, ref.namespace, ref.plural)
        if ref.plural != "configmaps":
            raise ValueError(f"{ref}: core resources other than configmaps are not fenced here")
        return (ref.namespace,)

    def get(self, ref: Ref) -> Obj | None:
        try:
            if ref.group:
                return self._call(
                    self.custom.get_namespaced_custom_object, *self._args(ref), ref.name
                )
            return self._call(self.core.read_namespaced_config_map, ref.name, *self._args(ref))
        except ApiRefusal as e:
            if e.status == 404:
                return None
            raise

    def create(self, ref: Ref, body: Obj) -> Obj:
        if ref.group:
            return self._call(self.custom.create_namespaced_custom_object, *self._args(ref), body)
        return self._call(self.core.create_namespaced_config_map, *self._args(ref), body)

    def replace(self, ref: Ref, body: Obj) -> Obj:
        if ref.group:
            fn = self.custom.replace_namespaced_custom_object
            return self._call(fn, *self._args(ref), ref.name, body)
        return self._call(self.core.replace_namespaced_config_map, ref.name, *self._args(ref), body)


class SelfFence:
    """The holder's own deadline: it may act only until `hold` seconds after the send of its
    last renewal that succeeded, on the monotonic clock.

    Measured from the send, not the answer: the server's renewTime, and the controller's
    sighting of it, are both later than the send, so the holder always stops before the
    controller (which waits `unreachable_after` + margin from the last renewal it *saw*)
    replaces it. A renewal that fails or whose answer never comes does not extend the deadline.
    """

    def __init__(
        self, hold: float = HOLD_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.hold, self.clock = hold, clock
        self._deadline: float | None = None

    @contextlib.contextmanager
    def renewal(self) -> Iterator[None]:
        """Wrap the renewal request: the deadline moves only if the block succeeds."""
        sent = self.clock()
        yield
        self.renewed(sent)

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at `sent_at` (this clock) succeeded; deadlines only move forward."""
        deadline = sent_at + self.hold
        if self._deadline is None or deadline > self._deadline:
            self._deadline = deadline

    def remaining(self) -> float:
        """Seconds left to act (0 when never renewed or past the deadline)."""
        if self._deadline is None:
            return 0.0
        return max(0.0, self._deadline - self.clock())

    def valid(self) -> bool:
        return self._deadline is not None and self.clock() < self._deadline
