"""Default local ports of the embedded control plane and of Pilotfish's host processes.

Chosen away from the usual defaults so a developer's other clusters do not collide.
"""

from typing import Final

ETCD_CLIENT: Final = 12379
ETCD_PEER: Final = 12380
APISERVER: Final = 16443
CONTROLLER_MANAGER: Final = 16257
SCHEDULER: Final = 16259
KWOK: Final = 16247
EXTENDER: Final = 16300
WEBHOOKS: Final = 16301
OPERATOR_METRICS: Final = 16302
PROMETHEUS: Final = 16390
# The real node (`pilotfish dev up --real-node`): kubelet's API and health, containerd's
# metrics (its health probe); the containerd API itself is a unix socket in the state dir.
KUBELET: Final = 16250
KUBELET_HEALTHZ: Final = 16248
CONTAINERD_METRICS: Final = 16249
