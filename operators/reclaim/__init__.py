"""Reclaim: batch runs on capacity production reserved but does not use, measured from
Prometheus, and gives it back the moment production needs it.

Each cycle, per node: batch allocatable = allocatable - the p95 usage of its reserved pods
over the window - a margin, written as the extended resources `batch.pilotfish.io/cpu`
(millicores) and `/memory` (bytes) that translated batch pods request, so kube-scheduler's
own fit check places them against it; when the node's batch pods ask for more than the new
figure, the newest of the lowest band are evicted until they fit. Stale usage or a silent
Prometheus halves the figure each cycle rather than trusting old numbers.

`settings` reads the environment and holds the PromQL; `model` parses nodes, pods and
samples; `decide` (pure) computes the figure and the eviction choice; `apply` writes them
conditionally; `controller` runs the cycle on the shared runtime.
"""

from pilotfish.operators.reclaim.controller import ReclaimController

__all__ = ["ReclaimController"]
