"""Node lifecycle: scheduling taints that follow each node's Ready condition.

Pilotfish replaces upstream's node lifecycle controller (it is switched off in the local
control plane), so it owns the taints that keep the scheduler off nodes that are not Ready:
`node.kubernetes.io/not-ready:NoSchedule` while Ready is False and
`node.kubernetes.io/unreachable:NoSchedule` while it is Unknown. The admission plugin
TaintNodesByCondition puts `not-ready` on every new node; this controller lifts it once the
node (kwok, or a kubelet) reports Ready.

`model` reads the node, `decide` (pure) plans its taint list, `apply` writes it with one
conditional patch, `controller` wires them to the shared node informer and the queue.
"""

from pilotfish.operators.nodelifecycle.controller import NodeLifecycleController

__all__ = ["NodeLifecycleController"]
