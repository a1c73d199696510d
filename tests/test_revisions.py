"""Revisions: stable hashes, numbering, reuse on undo, history limit and the undo target."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish.operators.serviceworkload.revisions import (
    ANNOTATION_CHANGE_CAUSE,
    HASH_ALPHABET,
    HASH_LENGTH,
    ActivateRevision,
    CreateRevision,
    RevisionCollision,
    RevisionInfo,
    UndoError,
    next_revision,
    owned_revisions,
    revision_body,
    template_hash,
    to_prune,
    undo_patch,
    undo_target,
)
from pilotfish.workloads import LABEL_REVISION, LABEL_WORKLOAD

UID = "uid-1"


def template(image: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": image}]},
    }


def sw(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "ServiceWorkload",
        "metadata": {
            "name": "web",
            "namespace": "ns",
            "uid": UID,
            "resourceVersion": "41",
            "annotations": annotations,
        },
        "spec": {"template": template("app:1")},
    }


def recorded(image: str, number: int, uid: str = UID) -> dict[str, Any]:
    body = revision_body(sw(), template_hash(template(image)), number, template(image), "t")
    body["metadata"]["ownerReferences"][0]["uid"] = uid
    body["metadata"]["resourceVersion"] = str(100 + number)
    return body


def info(image: str, number: int) -> RevisionInfo:
    return owned_revisions([recorded(image, number)], UID)[0]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_hash_ignores_key_order_and_is_label_safe(value: dict[str, Any]) -> None:
    reordered = dict(reversed(list(value.items())))
    h = template_hash(value)
    assert h == template_hash(reordered)
    assert len(h) == HASH_LENGTH and set(h) <= set(HASH_ALPHABET)


def test_hash_is_stable_across_processes() -> None:
    # Pinned: pods' revision labels and ControllerRevision names must not change with an
    # upgrade of Python or of this code, or every upgrade would roll every workload.
    assert template_hash(template("app:1")) == template_hash(copy.deepcopy(template("app:1")))
    assert template_hash({}) == "wv7q2vjtcg"
    assert template_hash(template("app:1")) != template_hash(template("app:2"))


def test_first_template_is_revision_one() -> None:
    step = next_revision([], template("app:1"))
    assert step == CreateRevision(template_hash(template("app:1")), 1)


def test_a_new_template_is_the_next_number() -> None:
    history = [info("app:1", 1), info("app:2", 2)]
    step = next_revision(history, template("app:3"))
    assert isinstance(step, CreateRevision) and step.number == 3


def test_the_newest_template_needs_nothing() -> None:
    assert next_revision([info("app:1", 1), info("app:2", 2)], template("app:2")) is None


def test_going_back_to_an_old_template_reuses_and_renumbers_its_revision() -> None:
    history = [info("app:1", 1), info("app:2", 2)]
    step = next_revision(history, template("app:1"))
    assert isinstance(step, ActivateRevision)
    assert step.revision.name == f"web-{template_hash(template('app:1'))}"
    assert step.number == 3
    assert step.revision.resource_version == "101", "the delete is conditional on it"


def test_a_hash_collision_is_refused() -> None:
    forged = recorded("app:1", 1)
    forged["data"] = template("something else")
    with pytest.raises(RevisionCollision):
        next_revision(owned_revisions([forged], UID), template("app:1"))


def test_revision_body_is_owned_labelled_and_carries_the_change_cause() -> None:
    body = revision_body(
        sw(**{ANNOTATION_CHANGE_CAUSE: "bump"}), "abc", 4, template("app:1"), "2024-01-01T00:00Z"
    )
    meta = body["metadata"]
    assert meta["name"] == "web-abc"
    assert meta["labels"] == {LABEL_WORKLOAD: "web", LABEL_REVISION: "abc"}
    ref = meta["ownerReferences"][0]
    assert ref["uid"] == UID and ref["controller"] and ref["blockOwnerDeletion"]
    assert meta["annotations"][ANNOTATION_CHANGE_CAUSE] == "bump"
    assert body["data"] == template("app:1") and body["revision"] == 4


def test_only_revisions_controlled_by_the_workload_count() -> None:
    mine, foreign = recorded("app:1", 1), recorded("app:2", 2, uid="other")
    assert [r.number for r in owned_revisions([foreign, mine], UID)] == [1]


def test_history_limit_prunes_the_oldest_unused_revisions() -> None:
    history = [info(f"app:{n}", n) for n in range(1, 7)]
    update = history[-1].hash
    in_use = {history[1].hash, update}  # revision 2 still has pods
    pruned = to_prune(history, keep=2, update_hash=update, in_use=in_use)
    assert [r.number for r in pruned] == [1, 3, 4]
    assert history[1] not in pruned
    assert to_prune(history, keep=10, update_hash=update, in_use=in_use) == []
    assert [r.number for r in to_prune(history, 0, update, {update})] == [1, 2, 3, 4, 5]


def test_undo_goes_to_the_newest_other_revision_or_the_one_asked_for() -> None:
    history = [info("app:1", 1), info("app:2", 2), info("app:3", 3)]
    current = history[-1].hash
    assert undo_target(history, current).number == 2
    assert undo_target(history, current, to_revision=1).number == 1
    with pytest.raises(UndoError, match="revision 9 not found"):
        undo_target(history, current, to_revision=9)
    with pytest.raises(UndoError, match="no previous revision"):
        undo_target(history[-1:], current)


def test_undo_patch_replaces_the_template_only_on_the_version_read() -> None:
    ops = undo_patch(sw(), info("app:2", 2))
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
        {"op": "replace", "path": "/spec/template", "value": template("app:2")},
    ]
