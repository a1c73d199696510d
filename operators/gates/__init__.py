"""The gate controller: releases pods from Pilotfish scheduling gates when their conditions hold.

The controller shape of docs/ARCHITECTURE.md: `model` (views parsed from the API), `terms`
(each gate's condition, re-derived from its GatePolicy), `conditions` (pure evaluation of
each condition type), `pacing` (per-tenant token bucket and in-flight cap), `plan` (what a
round reads and decides), `decide` -> `expiry` -> `status` (the pure phases of a round),
`apply` (the one executor: conditional writes, Events, audit, own writes), `usage` (quota
usage from pod events), `controller` (wiring), `audit` (the JSON-lines record of every
release and expiry).
"""

from pilotfish.operators.gates.apply import CONTROLLER
from pilotfish.operators.gates.controller import GateController

__all__ = ["CONTROLLER", "GateController"]
