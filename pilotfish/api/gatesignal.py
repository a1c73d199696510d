"""GateSignal: a named signal that an outside system raises to release GateSignal gates.

A GatePolicy gate with `condition: {type: GateSignal, signalName: X}` is released when the
GateSignal X of the pod's namespace is Ready. The signal is its own object, rather than an
annotation on the policy or the pods, so that the system that knows the condition (a data
pipeline, an image warmer, a ticket) needs rights on exactly one kind in one namespace: the
chart's ClusterRole `pilotfish-gatesignal-writer`, bound by a tenant in its own namespace.
It never needs rights on pods, so it cannot remove gates itself.
"""

from typing import Final, Literal

from pydantic import Field

from pilotfish.api.base import (
    AGE_COLUMN,
    ApiModel,
    ConditionsStatus,
    CrdInfo,
    PrinterColumn,
    Resource,
    object_field,
)

# The one condition type that matters: the outside system sets it True or False, with a
# reason and message that `kubectl pilotfish why` shows next to the pods it holds back.
READY: Final = "Ready"


class GateSignalSpec(ApiModel):
    """The desired state of a GateSignal: only a description, the state lives in status."""

    description: str | None = Field(
        default=None,
        max_length=1024,
        description="What the signal stands for and who raises it, for the people reading "
        "`kubectl get gs -o yaml` when pods wait on it.",
    )


class GateSignalStatus(ConditionsStatus):
    """The observed state of a GateSignal, written by the outside system that owns it.

    Condition Ready: True releases the gates waiting on this signal, False (or no condition)
    keeps them; reason and message say why, as with any Kubernetes condition.
    """

    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="metadata.generation the outside system last acted on.",
    )


class GateSignal(Resource):
    """A signal raised by an outside system: Ready=True releases the gates that wait on it."""

    crd = CrdInfo(
        plural="gatesignals",
        short_names=("gs",),
        scope="Namespaced",
        printer_columns=(
            PrinterColumn(
                "Ready",
                "string",
                '.status.conditions[?(@.type=="Ready")].status',
                "Whether the signal is raised: True, False, or empty when never set.",
            ),
            AGE_COLUMN,
        ),
    )

    api_version: Literal["pilotfish.io/v1alpha1"] = "pilotfish.io/v1alpha1"
    kind: Literal["GateSignal"] = "GateSignal"
    spec: GateSignalSpec = object_field(GateSignalSpec, "Desired state, written by people.")
    status: GateSignalStatus | None = Field(
        default=None,
        description="Observed state, written by the outside system that raises the signal.",
    )

    def is_ready(self) -> bool:
        """Raised: the Ready condition is True. Absent or Unknown means not raised, so a
        signal nobody has written yet holds its gates rather than releasing them."""
        if self.status is None:
            return False
        ready = self.status.condition(READY)
        return ready is not None and ready.status == "True"
