"""The slice planner: the fewest EndpointSlice writes (creates, updates, deletes) that make a
service's slices hold exactly the endpoints it should, keeping each endpoint where it is so
that one readiness flip costs one slice write.

Pure: no I/O, no clock. The executor (`apply`) writes the plan conditionally, each update
and delete on the resourceVersion it was planned from.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pilotfish.operators.endpoints.model import ADDRESS_TYPE, Endpoint, PortSet, Slice
from pilotfish.workloads import MAX_ENDPOINTS_PER_SLICE


@dataclass(frozen=True)
class SliceCreate:
    ports: PortSet
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True)
class SliceUpdate:
    name: str
    resource_version: str  # the version this update was planned from
    ports: PortSet
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True)
class SliceDelete:
    name: str
    resource_version: str


@dataclass(frozen=True)
class SlicePlan:
    creates: tuple[SliceCreate, ...] = ()
    updates: tuple[SliceUpdate, ...] = ()
    deletes: tuple[SliceDelete, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.creates or self.updates or self.deletes)

    @property
    def writes(self) -> int:
        return len(self.creates) + len(self.updates) + len(self.deletes)


@dataclass
class _Working:
    slice: Slice
    kept: list[Endpoint]
    changed: bool


def plan_slices(
    desired: Mapping[PortSet, Mapping[str, Endpoint]],
    existing: Sequence[Slice],
    max_endpoints: int = MAX_ENDPOINTS_PER_SLICE,
) -> SlicePlan:
    """The fewest slice writes that make `existing` hold exactly `desired`.

    Rules:
    1. An endpoint stays in the slice it is in (its content updated in place); a slice is only
       written when one of its own endpoints changed, left, or new ones are put into it.
    2. An endpoint found in several slices stays in the first by name; an endpoint that is no
       longer desired is removed; a slice left empty is deleted.
    3. A slice over `max_endpoints` is split: its first `max_endpoints` stay, the rest move.
    4. Slices whose ports or address type no longer match anything desired are deleted (the
       writer creates replacements before it deletes, so rotation never drops to nothing).
    5. New endpoints fill slices that are being written anyway, then go into new full slices;
       a remainder smaller than a slice goes into the fullest untouched slice it fits in
       (one write either way, fewer slices), else into one new slice.
    """
    placed: set[str] = set()
    deletes: list[SliceDelete] = []
    work: dict[PortSet, list[_Working]] = defaultdict(list)
    moved: dict[PortSet, list[Endpoint]] = defaultdict(list)
    for s in sorted(existing, key=lambda s: s.name):
        group = desired.get(s.ports)
        if group is None or s.address_type != ADDRESS_TYPE:
            deletes.append(SliceDelete(s.name, s.resource_version))
            continue
        kept: list[Endpoint] = []
        for ep in s.endpoints:
            want = group.get(ep.key)
            if want is None or ep.key in placed:
                continue
            placed.add(ep.key)
            kept.append(want)
        if len(kept) > max_endpoints:
            moved[s.ports].extend(kept[max_endpoints:])
            kept = kept[:max_endpoints]
        changed = not s.meta_current or kept != list(s.endpoints)
        work[s.ports].append(_Working(s, kept, changed))

    creates: list[SliceCreate] = []
    for ports in sorted(desired):
        group = desired[ports]
        pending = moved[ports] + [group[k] for k in sorted(group) if k not in placed]
        slots = work[ports]
        for w in slots:  # slices written anyway (or to be deleted): fill them first
            if not pending:
                break
            room = max_endpoints - len(w.kept)
            if (w.changed or not w.kept) and room > 0:
                w.kept.extend(pending[:room])
                pending = pending[room:]
                w.changed = True
        while len(pending) >= max_endpoints:
            creates.append(SliceCreate(ports, tuple(pending[:max_endpoints])))
            pending = pending[max_endpoints:]
        if pending:
            fits = [w for w in slots if w.kept and len(w.kept) + len(pending) <= max_endpoints]
            if fits:
                w = max(fits, key=lambda w: (len(w.kept), w.slice.name))
                w.kept.extend(pending)
                w.changed = True
            else:
                creates.append(SliceCreate(ports, tuple(pending)))

    updates: list[SliceUpdate] = []
    for ports in sorted(work):
        for w in work[ports]:
            if not w.kept:
                deletes.append(SliceDelete(w.slice.name, w.slice.resource_version))
            elif w.changed:
                updates.append(
                    SliceUpdate(w.slice.name, w.slice.resource_version, ports, tuple(w.kept))
                )
    return SlicePlan(tuple(creates), tuple(updates), tuple(deletes))
