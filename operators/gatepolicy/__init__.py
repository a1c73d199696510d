"""GatePolicy status: how many pods each policy's gates hold, and whether it is valid.

Read from the process's shared informers (the policies and the pods the gate controller
reads too), never listed by a reconcile.
"""

from pilotfish.operators.gatepolicy.controller import GatePolicyStatusController

__all__ = ["GatePolicyStatusController"]
