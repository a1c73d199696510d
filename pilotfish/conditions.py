"""Status conditions as every Pilotfish controller writes them.

One shape (type, status, reason, message, lastTransitionTime, observedGeneration), one rule
for lastTransitionTime (kept while the status is unchanged), and one bound on the message:
messages quote what others wrote (the API server's denials, the scheduler's reasons, a
tenant's GatePolicy terms), whose length the controller does not control.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

# As long as an Event's note may be (events.k8s.io/v1): enough for any denial a person reads.
CONDITION_MESSAGE_MAX: Final = 1024

Obj = dict[str, Any]


def set_condition(
    conditions: Sequence[Any],
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> Obj:
    """One condition, keeping its lastTransitionTime when its status did not change.

    The message is cut at `CONDITION_MESSAGE_MAX`. `conditions` entries that are not
    mappings (a status someone else wrote) are ignored.
    """
    if len(message) > CONDITION_MESSAGE_MAX:
        message = message[: CONDITION_MESSAGE_MAX - 4] + " ..."
    old = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    out: Obj = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out
