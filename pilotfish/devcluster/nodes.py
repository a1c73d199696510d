"""Fake nodes for kwok: realistic capacity, spread over three zones, kwok's selector label."""

from __future__ import annotations

from typing import Any

from pilotfish import names

ZONES = ("zone-a", "zone-b", "zone-c")
REGION = "local"
# One machine class: a 32-core, 128 GiB box, the kind the seeds size clusters with.
CAPACITY = {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "500Gi"}


def node_name(zone: str, index: int) -> str:
    return f"kwok-{zone}-{index}"


def fake_node(zone: str, index: int, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    name = node_name(zone, index)
    cap = dict(capacity or CAPACITY)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "pf.standard-32",
                names.LABEL_ZONE: zone,
                "topology.kubernetes.io/region": REGION,
                "type": "kwok",
                names.LABEL_FAKE_NODE: "true",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"providerID": f"kwok://{name}"},
        "status": {"capacity": cap, "allocatable": cap},
    }


def fleet(count: int) -> list[dict[str, Any]]:
    """`count` nodes assigned round-robin to the zones, so each zone differs by at most one."""
    return [fake_node(ZONES[i % len(ZONES)], i // len(ZONES)) for i in range(count)]
