"""Admission reviews of Pods: gates at creation (mutate) and band/quota checks (validate).

The mutating review is where `GatePolicy` gates get added: `spec.schedulingGates` can only
be set at creation, so this is the one chance. The validating review is where band and
`TeamQuota` checks will deny with a message naming the quota and the amount. Both are pure
functions of the AdmissionRequest so that every rule is a unit test; neither is written yet,
so both allow everything.
"""

from collections.abc import Mapping
from typing import Any

from pilotfish.webhooks.admission import Decision


def mutate(request: Mapping[str, Any]) -> Decision:
    """Allow unchanged until gate policies exist (an empty patch means no `patch` field)."""
    del request
    return Decision.mutate(())


def validate(request: Mapping[str, Any]) -> Decision:
    del request
    return Decision.allow()
