"""`make demo`: the local control plane, Pilotfish installed by its chart, an example of each kind.

Prints what a person needs to look around afterwards: a status table, the KUBECONFIG line and
how to stop it. Later capabilities extend it with their own scenarios.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pilotfish.devcluster import binaries, cluster
from pilotfish.devcluster.components import Layout


def examples_dir() -> Path:
    root = binaries.checkout_root()
    if root is None:
        raise RuntimeError("the demo applies examples/ from a source checkout")
    return root / "examples"


def kubectl(layout: Layout, *args: str) -> str:
    bins = binaries.bin_dir()
    cmd = [str(bins / "kubectl"), "--kubeconfig", str(layout.admin_kubeconfig), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def run(state: Path, nodes: int = cluster.DEFAULT_NODES) -> int:
    print(f"==> starting the local control plane and Pilotfish ({state})")
    layout = cluster.up(state, cluster.ClusterSpec(nodes=nodes))
    print("==> components")
    st = cluster.status(state)
    for name, c in st["components"].items():
        print(f"    {name:<26} pid {c['pid']!s:<8} {'healthy' if c['healthy'] else 'NOT HEALTHY'}")
    print(f"    ready kwok nodes: {st.get('readyNodes')}")
    print(
        kubectl(layout, "get", "nodes", "-L", "topology.kubernetes.io/zone", "--no-headers")
        .rstrip()
        .replace("\n", "\n    ")
        .join(("    ", ""))
    )
    print("==> applying examples/ (one of each Pilotfish kind)")
    print(kubectl(layout, "apply", "-f", str(examples_dir())).rstrip())
    print("==> kubectl get pilotfish -A")
    print(kubectl(layout, "get", "pilotfish", "-A").rstrip())
    print("\nUse it:")
    for line in cluster.env_lines(state):
        print(f"    {line}")
    print("    kubectl get pilotfish -A; kubectl explain serviceworkload.spec.strategy")
    print(f"Stop it:\n    make down    (or: pilotfish dev down --state {state})")
    return 0
