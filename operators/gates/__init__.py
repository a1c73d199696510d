"""The gate controller: releases pods from Pilotfish scheduling gates when their conditions hold.

Layout follows ARCHITECTURE section 3: `model` (views parsed from the API), `conditions`
(pure evaluation of each condition type), `pacing` (per-tenant token bucket and in-flight
cap), `decide` (pure: observed state and now to actions), `controller` (observe and act
with conditional writes), `audit` (the JSON-lines record of every release and expiry).
"""

from pilotfish.operators.gates.controller import CONTROLLER, GateController

__all__ = ["CONTROLLER", "GateController"]
