"""Node lifecycle: scheduling taints that follow each node's Ready condition, and machine
failure detected by lease silence on this process's own clock.

Pilotfish replaces upstream's node lifecycle controller (it is switched off in the local
control plane, mode `pilotfish`), so it owns the taints that keep the scheduler off nodes
that are not Ready: `node.kubernetes.io/not-ready:NoSchedule` while Ready is False and
`node.kubernetes.io/unreachable:NoSchedule` while it is Unknown. The admission plugin
TaintNodesByCondition puts `not-ready` on every new node; this controller lifts it once the
node (kwok, or a kubelet) reports Ready.

On top of that, from the node-lease silence tracker (`pilotfish.nodesilence`): a node silent
for the unreachable timeout is marked (Ready=Unknown, `unreachable` NoSchedule + NoExecute,
its pods Ready=False), its ordinary pods are evicted after the eviction wait, a zone-sized
silence brakes both (`brake`), and a returning node's unreachable taints are lifted. In mode
`upstream` (a managed cluster's own controller runs) it only tracks silence and reports the
brake.

`model` reads nodes and pods; `silence` (pure) plans one node from `decide` (taints),
`unreachable`, `eviction` and the `brake` verdict; `apply` and `status` write the plan
conditionally; `zones` keeps zone membership and brakes; `controller` wires them to the
shared informers and the queue.
"""

from pilotfish.operators.nodelifecycle.controller import NodeLifecycleController

__all__ = ["NodeLifecycleController"]
