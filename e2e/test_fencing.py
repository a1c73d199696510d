"""Fencing at the resource, against the real API server: a stale holder's write is refused.

A tenant with `edit` writes a fenced ConfigMap through `pilotfish.fencing` as the holder of
epoch 5; a copy holding epoch 4 (a paused old holder that woke up) is refused, by the library
when it reads first and by the chart's ValidatingAdmissionPolicy when it writes blind; epoch 6
(the next holder) is taken; the fence cannot be taken off; unlabelled objects are untouched.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant
from pilotfish import fencing
from pilotfish.fencing import Fenced, Ref, StaleEpoch
from pilotfish.timeutil import format_micro_time, utcnow

FIELD = "metadata.annotations[pilotfish.io/epoch]"


def message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body)["message"])
    except (ValueError, KeyError, TypeError):
        return str(err.body)


def refused(tenant: Tenant, body: dict[str, Any]) -> str:
    """The API server's refusal of the tenant's write of `body` (a blind PUT)."""
    core = k8s.CoreV1Api(tenant.api)
    meta = body["metadata"]
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map(meta["name"], tenant.namespace, body)
    assert err.value.status == 403, message(err.value)
    text = message(err.value)
    assert fencing.POLICY in text and fencing.RULE in text
    return text


def shards(epoch: int, owner: str, *, fenced: bool = True) -> dict[str, Any]:
    labels = {fencing.LABEL_FENCED: "true"} if fenced else {}
    return {
        "metadata": {
            "name": "shards",
            "labels": labels,
            "annotations": {fencing.ANNOTATION_EPOCH: str(epoch)},
        },
        "data": {"owner": owner},
    }


def test_a_stale_epoch_is_refused_at_the_resource(tenant: Tenant) -> None:
    ns = tenant.namespace
    ref = Ref.configmap(ns, "shards")
    core = k8s.CoreV1Api(tenant.api)

    def own(data: dict[str, Any]) -> None:
        data.setdefault("data", {})["owner"] = "five"

    Fenced.of(tenant.api, ref, epoch=5).update(own)
    stored = core.read_namespaced_config_map("shards", ns)
    assert stored.metadata.labels[fencing.LABEL_FENCED] == "true"
    assert stored.metadata.annotations[fencing.ANNOTATION_EPOCH] == "5"

    # Epoch 4 written blind, as any client would: the API server refuses it, in words.
    text = refused(tenant, shards(4, "four"))
    assert f"{FIELD} 4 is lower than the object's 5" in text
    # The library's blind write hears the same refusal as StaleEpoch...
    with pytest.raises(StaleEpoch) as stale:
        Fenced.of(tenant.api, ref, epoch=4).put(shards(4, "four"))
    assert (stale.value.theirs, stale.value.ours) == (5, 4)
    assert stale.value.refused_by == f"admission policy {fencing.POLICY}"
    assert str(ref) in str(stale.value) and f"{FIELD} 4 is lower than" in str(stale.value)
    # ... and its read-then-write refuses before sending anything.
    with pytest.raises(StaleEpoch, match=r"carries epoch 5, newer than ours \(4\)"):
        Fenced.of(tenant.api, ref, epoch=4).update(lambda cm: cm["data"].update(owner="four"))
    assert core.read_namespaced_config_map("shards", ns).data == {"owner": "five"}

    # The next holder, epoch 6, takes it; the same holder may write again.
    Fenced.of(tenant.api, ref, epoch=6).put(shards(6, "six"))
    Fenced.of(tenant.api, ref, epoch=6).update(lambda cm: cm["data"].update(shard="a"))
    stored = core.read_namespaced_config_map("shards", ns)
    assert stored.data == {"owner": "six", "shard": "a"}
    assert stored.metadata.annotations[fencing.ANNOTATION_EPOCH] == "6"

    # The fence cannot be taken off, nor the epoch dropped or garbled.
    text = refused(tenant, shards(6, "six", fenced=False))
    assert "label pilotfish.io/fenced cannot be removed (it is 'true')" in text
    relabelled = shards(6, "six")
    relabelled["metadata"]["labels"][fencing.LABEL_FENCED] = "false"
    assert "cannot be changed to 'false'" in refused(tenant, relabelled)
    dropped = shards(6, "six")
    del dropped["metadata"]["annotations"][fencing.ANNOTATION_EPOCH]
    assert f"{FIELD} is missing" in refused(tenant, dropped)
    garbled = shards(6, "six")
    garbled["metadata"]["annotations"][fencing.ANNOTATION_EPOCH] = "six"
    assert f"{FIELD} 'six' is not an integer" in refused(tenant, garbled)
    res = tenant.kubectl("label", "configmap", "shards", f"{fencing.LABEL_FENCED}-", check=False)
    assert res.returncode != 0 and "cannot be removed" in res.stderr
    assert core.read_namespaced_config_map("shards", ns).data == {"owner": "six", "shard": "a"}

    # A labelled object cannot even be created without an integer epoch.
    bad = shards(1, "x")
    bad["metadata"]["name"] = "garbled"
    bad["metadata"]["annotations"][fencing.ANNOTATION_EPOCH] = "-1"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(ns, bad)
    assert f"{FIELD} '-1' is not an integer" in message(err.value)

    # An unlabelled ConfigMap is none of the policy's business.
    plain = shards(5, "five", fenced=False)
    plain["metadata"]["name"] = "plain"
    core.create_namespaced_config_map(ns, plain)
    plain["metadata"]["annotations"][fencing.ANNOTATION_EPOCH] = "4"
    core.replace_namespaced_config_map("plain", ns, plain)
    tenant.kubectl("annotate", "configmap", "plain", f"{fencing.ANNOTATION_EPOCH}-")


def test_a_lease_used_as_a_lock_is_fenced_too(env: Env, namespace: str) -> None:
    """Whoever writes (here the cluster admin): the next holder takes the lock, the old one is
    refused at the resource."""
    ref = Ref.lease(namespace, "shard-lock")
    Fenced.of(env.api, ref, epoch=1).update(
        fencing.lease_holder("pod-a", 40, format_micro_time(utcnow()))
    )
    taken = Fenced.of(env.api, ref, epoch=2).update(
        fencing.lease_holder("pod-b", 40, format_micro_time(utcnow()))
    )
    assert taken["spec"]["holderIdentity"] == "pod-b"
    assert taken["spec"]["leaseTransitions"] == 2
    # The old holder, read-modify-write without the library: refused by the API server.
    leases = k8s.CoordinationV1Api(env.api)
    current = leases.read_namespaced_lease("shard-lock", namespace)
    current.metadata.annotations[fencing.ANNOTATION_EPOCH] = "1"
    current.spec.holder_identity = "pod-a"
    with pytest.raises(ApiException) as err:
        leases.replace_namespaced_lease("shard-lock", namespace, current)
    assert f"{FIELD} 1 is lower than the object's 2" in message(err.value)
    # With it: refused before it sends anything.
    with pytest.raises(StaleEpoch) as stale:
        Fenced.of(env.api, ref, epoch=1).update(
            fencing.lease_holder("pod-a", 40, format_micro_time(utcnow()))
        )
    assert (stale.value.theirs, stale.value.ours) == (2, 1)
    assert leases.read_namespaced_lease("shard-lock", namespace).spec.holder_identity == "pod-b"
