"""`pilotfish.fencing`: epochs, the policy rule in Python, the read-check-write, the transport.

The fake API below keeps objects with resourceVersions and, when `policy` is on, refuses
writes as the chart's ValidatingAdmissionPolicy would (`fencing.refusal`, which the chart's
words are held to). The properties run without it too: the library's conditional update must
never let a stored epoch go down on its own.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import fencing
from pilotfish.fencing import ApiRefusal, Fenced, NoEpoch, Ref, StaleEpoch

REF = Ref.configmap("team-a", "shards")
DENIED = "configmaps \"shards\" is forbidden: ValidatingAdmissionPolicy 'pilotfish-fencing' with "
DENIED += "binding 'pilotfish-fencing' denied request: "


class FakeApi:
    """One namespace's objects by name, with resourceVersions and (optionally) the policy.

    `before_write` runs before every write reaches the store: a concurrent writer's chance.
    """

    def __init__(self, policy: bool = True) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.policy = policy
        self.rv = 0
        self.writes: list[str] = []
        self.before_write: Callable[[], None] | None = None

    def get(self, ref: Ref) -> dict[str, Any] | None:
        obj = self.objects.get(ref.name)
        return copy.deepcopy(obj) if obj is not None else None

    def _store(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[ref.name] = stored
        return copy.deepcopy(stored)

    def _admit(self, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        why = fencing.refusal(old, new) if self.policy else None
        if why is not None:
            raise ApiRefusal(403, DENIED + why + ": " + fencing.RULE)

    def create(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        self.writes.append("create")
        if self.before_write:
            self.before_write()
        if ref.name in self.objects:
            raise ApiRefusal(409, "already exists")
        self._admit(None, body)
        return self._store(ref, body)

    def replace(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        self.writes.append("replace")
        if self.before_write:
            self.before_write()
        old = self.objects.get(ref.name)
        if old is None:
            raise ApiRefusal(404, "not found")
        rv = body["metadata"].get("resourceVersion")
        if rv is not None and rv != old["metadata"]["resourceVersion"]:
            raise ApiRefusal(409, "the object has been modified")
        self._admit(old, body)
        return self._store(ref, body)


def stored_epoch(api: FakeApi) -> int | None:
    return fencing.epoch_of(api.objects.get(REF.name))


def put_owner(owner: str) -> Callable[[dict[str, Any]], None]:
    def change(cm: dict[str, Any]) -> None:
        cm.setdefault("data", {})["owner"] = owner

    return change


# --- epochs ---------------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=10**18 - 1))
def test_every_epoch_reads_back(n: int) -> None:
    assert fencing.parse_epoch(str(n)) == n


@given(st.text(max_size=24))
def test_only_ascii_digits_are_an_epoch(text: str) -> None:
    """The same strings as the policy's CEL pattern (RE2 `$` is the end of the text)."""
    ok = re.fullmatch("[0-9]{1,18}", text, flags=re.ASCII) is not None
    assert (fencing.parse_epoch(text) is not None) == ok


@pytest.mark.parametrize("value", ["", "-1", "+1", "1.0", " 1", "1\n", "٣", "1" * 19, "0x1"])
def test_not_epochs(value: str) -> None:
    assert fencing.parse_epoch(value) is None


def test_the_epoch_comes_from_the_downward_api_env() -> None:
    assert fencing.epoch_from_env({"PILOTFISH_EPOCH": "7"}) == 7
    with pytest.raises(NoEpoch, match="PILOTFISH_EPOCH is not set: only at-most-one pods"):
        fencing.epoch_from_env({})
    with pytest.raises(NoEpoch, match=r"PILOTFISH_EPOCH='seven': an epoch is a decimal integer"):
        fencing.epoch_from_env({"PILOTFISH_EPOCH": "seven"})


def fenced(epoch: str | None, label: str | None = "true") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "shards"}
    if label is not None:
        meta["labels"] = {fencing.LABEL_FENCED: label}
    if epoch is not None:
        meta["annotations"] = {fencing.ANNOTATION_EPOCH: epoch}
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (fenced("5"), fenced("4"), "pilotfish.io/epoch 4 is lower than the object's 5"),
        (fenced("5"), fenced("5"), None),
        (fenced("5"), fenced("6"), None),
        (fenced("5"), fenced(None), "pilotfish.io/epoch missing"),
        (fenced("5"), fenced("x"), "pilotfish.io/epoch 'x' is not an integer"),
        (fenced("5"), fenced("4", label=None), "label pilotfish.io/fenced removed"),
        (fenced("5"), fenced("5", label="false"), "label pilotfish.io/fenced removed"),
        (fenced("5", label=None), fenced("4", label=None), None),  # not fenced: not judged
        (fenced("5", label=None), fenced("4"), "4 is lower than the object's 5"),
        (fenced("junk"), fenced("1"), None),
        (None, fenced("1"), None),
        (None, fenced("-1"), "'-1' is not an integer"),
        ({"metadata": "junk"}, fenced("1"), None),
    ],
)
def test_refusal(old: dict[str, Any] | None, new: dict[str, Any], why: str | None) -> None:
    got = fencing.refusal(old, new)
    assert (got is None) == (why is None) and (why is None or why in str(got))


@given(st.integers(0, 100), st.integers(0, 100))
def test_a_lower_epoch_is_refused_and_no_other(old: int, new: int) -> None:
    assert (fencing.refusal(fenced(str(old)), fenced(str(new))) is None) == (new >= old)


# --- the library against the fake API ------------------------------------------------------


def test_update_creates_the_object_fenced_then_rewrites_it() -> None:
    api = FakeApi()
    Fenced(api, REF, epoch=5).update(put_owner("five"))
    obj = api.objects["shards"]
    assert obj["apiVersion"] == "v1" and obj["kind"] == "ConfigMap"
    assert obj["metadata"]["namespace"] == "team-a"
    assert obj["metadata"]["labels"] == {fencing.LABEL_FENCED: "true"}
    assert obj["metadata"]["annotations"] == {fencing.ANNOTATION_EPOCH: "5"}

    def unfence(cm: dict[str, Any]) -> None:  # a change cannot take the fence off
        cm["data"]["owner"] = "six"
        del cm["metadata"]["labels"][fencing.LABEL_FENCED]
        cm["metadata"]["annotations"][fencing.ANNOTATION_EPOCH] = "1"

    Fenced(api, REF, epoch=6).update(unfence)
    assert api.objects["shards"]["data"] == {"owner": "six"}
    assert stored_epoch(api) == 6 and fencing.is_fenced(api.objects["shards"])


@pytest.mark.parametrize("policy", [True, False])
def test_an_older_holder_is_refused_before_it_writes(policy: bool) -> None:
    api = FakeApi(policy)
    Fenced(api, REF, epoch=5).update(put_owner("five"))
    with pytest.raises(StaleEpoch) as stale:
        Fenced(api, REF, epoch=4).update(put_owner("four"))
    assert (stale.value.theirs, stale.value.ours, stale.value.refused_by) == (5, 4, fencing.READ)
    assert str(stale.value) == (
        "configmaps team-a/shards carries epoch 5, newer than ours (4): not written: a newer "
        "holder has written it since"
    )
    assert api.writes == ["create"] and api.objects["shards"]["data"] == {"owner": "five"}


@pytest.mark.parametrize("policy", [True, False])
def test_a_newer_holder_between_read_and_write_wins(policy: bool) -> None:
    """The compare-and-swap: the old holder's write conflicts, it reads again and stops."""
    api = FakeApi(policy)
    Fenced(api, REF, epoch=4).update(put_owner("four"))

    def newer_holder_writes() -> None:
        api.before_write = None
        Fenced(api, REF, epoch=5).update(put_owner("five"))

    api.before_write = newer_holder_writes
    with pytest.raises(StaleEpoch, match=r"carries epoch 5, newer than ours \(4\)"):
        Fenced(api, REF, epoch=4).update(put_owner("four again"))
    assert api.objects["shards"]["data"] == {"owner": "five"}


def test_a_conflict_with_the_same_epoch_is_retried_and_keeps_both_changes() -> None:
    api = FakeApi()
    Fenced(api, REF, epoch=3).update(put_owner("three"))

    def sibling() -> None:
        api.before_write = None
        Fenced(api, REF, epoch=3).update(lambda cm: cm["data"].update(shard="a"))

    api.before_write = sibling
    Fenced(api, REF, epoch=3).update(lambda cm: cm["data"].update(shard2="b"))
    assert api.objects["shards"]["data"] == {"owner": "three", "shard": "a", "shard2": "b"}


def test_a_blind_write_refused_by_the_policy_is_stale_epoch() -> None:
    api = FakeApi()
    Fenced(api, REF, epoch=5).update(put_owner("five"))
    with pytest.raises(StaleEpoch) as stale:
        Fenced(api, REF, epoch=4).put({"metadata": {"resourceVersion": "1"}, "data": {}})
    assert (stale.value.theirs, stale.value.ours) == (5, 4)
    assert stale.value.refused_by == "admission policy pilotfish-fencing"
    assert "pilotfish.io/epoch 4 is lower than the object's 5" in str(stale.value)
    Fenced(api, REF, epoch=6).put({"metadata": {}, "data": {"owner": "six"}})
    assert stored_epoch(api) == 6


def test_other_refusals_are_not_stale_epochs() -> None:
    class Rbac(FakeApi):
        def replace(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
            raise ApiRefusal(403, 'configmaps "shards" is forbidden: User "x" cannot update')

    api = Rbac()
    api.objects["shards"] = fenced("1") | {"data": {}}
    api.objects["shards"]["metadata"]["resourceVersion"] = "1"
    with pytest.raises(ApiRefusal, match="cannot update"):
        Fenced(api, REF, epoch=2).update(put_owner("two"))


def test_put_is_for_configmaps() -> None:
    with pytest.raises(ValueError, match="put is for ConfigMaps only"):
        Fenced(FakeApi(), Ref.lease("team-a", "lock"), epoch=1).put({"metadata": {}})


def test_a_lease_lock_counts_transitions_only_when_the_holder_changes() -> None:
    api = FakeApi()
    ref = Ref.lease("team-a", "shards")
    Fenced(api, ref, epoch=1).update(fencing.lease_holder("a", 40, "t1"))
    Fenced(api, ref, epoch=1).update(fencing.lease_holder("a", 40, "t2"))
    lease = Fenced(api, ref, epoch=2).update(fencing.lease_holder("b", 40, "t3"))
    assert lease["apiVersion"] == "coordination.k8s.io/v1" and lease["kind"] == "Lease"
    assert lease["spec"] == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 40,
        "renewTime": "t3",
        "acquireTime": "t3",
        "leaseTransitions": 2,
    }


# Writers with random epochs, each an update or a blind put, some with a newer holder's write
# landing between their read and their write.
WRITES = st.lists(
    st.tuples(st.integers(1, 6), st.booleans(), st.none() | st.integers(1, 6)), max_size=12
)


@settings(max_examples=300, deadline=None)
@given(writes=WRITES, policy=st.booleans())
def test_the_stored_epoch_never_goes_down(
    writes: list[tuple[int, bool, int | None]], policy: bool
) -> None:
    api = FakeApi(policy)
    high = 0
    for epoch, blind, meanwhile in writes:
        if blind and not policy:
            continue  # a blind write has only the policy to judge it
        if meanwhile is not None:

            def interleaved(e: int = meanwhile) -> None:
                api.before_write = None
                with contextlib.suppress(StaleEpoch):
                    Fenced(api, REF, epoch=e).update(put_owner(str(e)))

            api.before_write = interleaved
        before = stored_epoch(api) or 0
        try:
            writer = Fenced(api, REF, epoch=epoch)
            if blind and REF.name in api.objects:
                writer.put({"metadata": {}, "data": {"owner": str(epoch)}})
            else:
                writer.update(put_owner(str(epoch)))
        except StaleEpoch as e:
            assert e.ours == epoch and (e.theirs or 0) > epoch
            assert (stored_epoch(api) or 0) > epoch
        else:
            assert stored_epoch(api) == epoch >= before
        api.before_write = None
        now = stored_epoch(api) or 0
        assert now >= high
        high = now
        assert api.objects[REF.name]["data"]["owner"] == str(now)


# --- the kubernetes transport --------------------------------------------------------------


class Answer:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class FakeCalls:
    """Stands in for CoreV1Api and CustomObjectsApi: records calls, answers or raises."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail = fail

    def __getattr__(self, name: str) -> Callable[..., Answer]:
        def call(*args: Any, _preload_content: bool = True) -> Answer:
            assert _preload_content is False  # raw JSON, not the client's model classes
            self.calls.append((name, args))
            if self.fail is not None:
                raise self.fail
            return Answer({"metadata": {"name": "shards"}})

        return call


def transport(fail: Exception | None = None) -> tuple[fencing.KubeTransport, FakeCalls]:
    t = fencing.KubeTransport(None)
    fake = FakeCalls(fail)
    t.core = t.custom = fake
    return t, fake


def test_the_transport_speaks_core_configmaps_and_any_group_s_resources() -> None:
    t, fake = transport()
    body: dict[str, Any] = {"metadata": {}}
    t.get(REF)
    t.replace(REF, body)
    lease = Ref.lease("team-a", "lock")
    t.create(lease, body)
    t.replace(lease, body)
    assert fake.calls == [
        ("read_namespaced_config_map", ("shards", "team-a")),
        ("replace_namespaced_config_map", ("shards", "team-a", body)),
        (
            "create_namespaced_custom_object",
            ("coordination.k8s.io", "v1", "team-a", "leases", body),
        ),
        (
            "replace_namespaced_custom_object",
            ("coordination.k8s.io", "v1", "team-a", "leases", "lock", body),
        ),
    ]
    with pytest.raises(ValueError, match="core resources other than configmaps"):
        t.get(Ref("", "v1", "secrets", "Secret", "team-a", "s"))


def test_the_transport_turns_api_errors_into_refusals() -> None:
    from kubernetes.client.exceptions import ApiException

    missing = ApiException(status=404, reason="Not Found")
    assert transport(missing)[0].get(REF) is None
    denied = ApiException(status=403, reason="Forbidden")
    denied.body = json.dumps({"message": DENIED + "no"})
    t, _ = transport(denied)
    with pytest.raises(ApiRefusal) as err:
        t.replace(REF, {"metadata": {}})
    assert (err.value.status, err.value.message) == (403, DENIED + "no")
    garbled = ApiException(status=500, reason="Internal Server Error")
    garbled.body = "<html>"
    with pytest.raises(ApiRefusal, match="500: Internal Server Error"):
        transport(garbled)[0].create(REF, {"metadata": {}})
