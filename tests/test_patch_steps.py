"""`patches.Steps`: the mutation steps' ops, each computed on the object the steps before left,
applied to one copy in place; the object the review sent is never changed."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st

from pilotfish.webhooks.patches import Steps, set_entries

KEYS = st.text(alphabet="ab/~.", min_size=1, max_size=4)
MAPS = st.dictionaries(KEYS, st.text(alphabet="xyz", max_size=3), max_size=3)


def pod(labels: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p"}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta, "spec": {"containers": [{"name": "c"}]}}


@given(st.none() | MAPS, st.lists(MAPS, max_size=4))
def test_the_steps_ops_replayed_on_the_original_give_the_object_they_left(
    labels: dict[str, str] | None, steps_entries: list[dict[str, str]]
) -> None:
    original = pod(labels)
    sent = copy.deepcopy(original)
    steps = Steps(sent)
    for entries in steps_entries:
        steps.add(
            set_entries(
                steps.obj.get("metadata", {}).get("labels"), ("metadata", "labels"), entries
            )
        )
    assert sent == original  # the review's own object is untouched
    assert jsonpatch.apply_patch(copy.deepcopy(original), steps.ops) == steps.obj
    want = dict(labels or {})
    for entries in steps_entries:
        want.update(entries)
    assert steps.obj.get("metadata", {}).get("labels", {}) == want


def test_no_ops_leave_the_very_object_and_copy_nothing() -> None:
    sent = pod({"app": "web"})
    steps = Steps(sent)
    steps.add([])
    assert steps.obj is sent and steps.ops == []
