"""What a local cluster was asked for, saved in its state directory so `status`, `down`,
later `up`s and every restart of a host process agree on it."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pilotfish.devcluster import components
from pilotfish.devcluster.components import Layout, Ports

DEFAULT_NODES = 12


def default_state_dir() -> Path:
    env = os.environ.get("PILOTFISH_STATE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "pilotfish" / "dev"


@dataclass(frozen=True)
class ClusterSpec:
    """What `up` was asked for; saved so `status`, `down` and later `up`s agree."""

    nodes: int = DEFAULT_NODES
    port_offset: int = 0
    pilotfish: bool = True
    # Who notices a silent machine: "pilotfish" or "upstream" (`components.CONTROLLERS`).
    node_lifecycle: str = components.NODE_LIFECYCLE_PILOTFISH
    # PILOTFISH_RECLAIM_* (for the operator) and PILOTFISH_PROMETHEUS_SCRAPE_INTERVAL, from
    # the environment of whoever ran `up` (`prometheus.merge_settings`); saved, so a restarted
    # operator or Prometheus keeps them.
    settings: tuple[tuple[str, str], ...] = ()
    # One real kubelet (containerd, runc, a bridge network) beside the kwok fleet (`realnode`).
    real_node: bool = False

    def __post_init__(self) -> None:
        components.check_node_lifecycle(self.node_lifecycle)
        object.__setattr__(self, "settings", tuple((str(k), str(v)) for k, v in self.settings))

    @property
    def ports(self) -> Ports:
        return Ports().shifted(self.port_offset)


def load_spec(layout: Layout) -> ClusterSpec | None:
    try:
        data = json.loads(layout.cluster_file.read_text())
    except (OSError, ValueError):
        return None
    fields = {f.name for f in dataclasses.fields(ClusterSpec)}
    return ClusterSpec(**{k: v for k, v in data.items() if k in fields})
