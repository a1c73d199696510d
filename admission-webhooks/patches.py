"""RFC 6902 JSON-patch operations that add to a Kubernetes object without clobbering it.

A mutating webhook sees the object before defaulting, so maps and lists it wants to add to
may be missing or null; adding `/metadata/labels/x` to a missing map fails the whole request
at the API server, while adding `/metadata/labels` to an existing map would erase the
client's labels. These helpers pick the right form from what the object actually holds, and
escape keys per RFC 6901 (label keys like `gates.pilotfish.io/gated` contain `/`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jsonpatch

Op = dict[str, Any]


def escape(token: str) -> str:
    """One RFC 6901 reference token: `~` first, so the `~1` written for `/` stays intact."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str) -> str:
    return "".join("/" + escape(t) for t in tokens)


def set_entries(current: Any, at: Sequence[str], entries: Mapping[str, str]) -> list[Op]:
    """Set string map entries (labels, annotations) at `at`, creating the map if needed.

    `add` on an existing member replaces its value, so a value the client put under one of
    these keys is overwritten, never duplicated.
    """
    if not entries:
        return []
    if not isinstance(current, Mapping):
        return [{"op": "add", "path": pointer(*at), "value": dict(entries)}]
    return [{"op": "add", "path": pointer(*at, k), "value": v} for k, v in entries.items()]


def remove_entries(current: Any, at: Sequence[str], keys: Iterable[str]) -> list[Op]:
    """Remove the map entries that exist; `remove` of a missing member would fail the patch."""
    if not isinstance(current, Mapping):
        return []
    return [{"op": "remove", "path": pointer(*at, k)} for k in keys if k in current]


def append_items(current: Any, at: Sequence[str], items: Sequence[Any]) -> list[Op]:
    """Append to the list at `at`, creating it if it is missing or null."""
    if not items:
        return []
    if not isinstance(current, list):
        return [{"op": "add", "path": pointer(*at), "value": list(items)}]
    return [{"op": "add", "path": pointer(*at, "-"), "value": item} for item in items]


class Steps:
    """The ops of several mutation steps, and the object as they leave it so far.

    Each step computes its ops on the object as the steps before it left it, because the
    API server applies them in order. One copy of the object is made, at the first op, and
    every step's ops are applied to it in place: a copy per step cost the mutating review
    more than every rule it checks (`jsonpatch.apply_patch` deep-copies the pod each time).
    """

    def __init__(self, obj: Mapping[str, Any]) -> None:
        self.obj: Mapping[str, Any] = obj
        self.ops: list[Op] = []

    def add(self, ops: Sequence[Op]) -> None:
        if not ops:
            return
        if not self.ops:  # still the caller's object
            self.obj = copy.deepcopy(self.obj)
        self.obj = jsonpatch.apply_patch(self.obj, list(ops), in_place=True)
        self.ops += ops
