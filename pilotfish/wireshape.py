"""Strict shapes of what the API server and kube-scheduler send, and one way to report a misfit.

The webhooks and the extender receive Kubernetes objects as JSON and read them as dicts
(ARCHITECTURE section 3). Their readers use `.get` chains that assume each field has the
type the API server gives it; a body from anyone else can put a list where a dict belongs.
So every body is checked here first against a pydantic model of the fields Pilotfish reads
(unknown fields pass untouched, as the API server may add them), and a misfit becomes one
`BadRequest` naming the field, the rule and what came instead. The models validate only:
callers keep the decoded dicts, which the reviews and the scheduler hot path index fast.
"""

from typing import Annotated, Any, Final, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
)
from pydantic.alias_generators import to_camel

from pilotfish import quantity
from pilotfish.httpserver import BadRequest
from pilotfish.quantity import QuantityError

# How many misfits one answer lists: enough to fix a hand-written body in one go, short
# enough for the API server's error log line.
MAX_PROBLEMS: Final = 3

M = TypeVar("M", bound="Strict")


class Strict(BaseModel):
    """Exact JSON types (no "1" for 1, no 1 for true), camelCase names, unknown fields kept."""

    model_config = ConfigDict(
        strict=True, extra="allow", alias_generator=to_camel, populate_by_name=False
    )


def kind_of(value: Any) -> str:
    """A JSON type name for an error message."""
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-", "union[", "lax-or-strict", "literal[")):
            continue  # pydantic's names for the branches of a union, not a field
        else:
            out += f".{part}" if out else part
    return out or "request body"


def _got(value: Any) -> str:
    """The offending value's type, and the value itself when it is short enough to quote."""
    if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 64):
        text = repr(value)
        if len(text) <= 64:
            return f"{kind_of(value)} {text}"
    return kind_of(value)


# pydantic's wording for a wrong JSON type, said in JSON's words.
_RULES: Final = {
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be an array",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
}


def describe(error: ValidationError, prefix: str = "") -> str:
    """One line naming each misfit: `Pod.spec.containers[0].name: Input should be a valid
    string, got integer 7`."""
    seen: dict[str, str] = {}
    for e in error.errors(include_url=False):
        path = _path(prefix, tuple(e["loc"]))
        if path in seen:
            continue  # a union reports one error per branch; the first says enough
        if e["type"] == "missing":
            seen[path] = f"{path}: required field is missing"
        else:
            ctx = e.get("ctx") or {}
            if e["type"] == "value_error":
                rule = str(ctx["error"])
            elif e["type"] == "literal_error":
                rule = f"must be {ctx['expected']}"
            else:
                rule = _RULES.get(e["type"], e["msg"])
            seen[path] = f"{path}: {rule}, got {_got(e.get('input'))}"
    problems = list(seen.values())
    more = len(problems) - MAX_PROBLEMS
    text = "; ".join(problems[:MAX_PROBLEMS])
    return text + (f"; and {more} more" if more > 0 else "")


def check(model: type[M], value: Any, prefix: str = "") -> M:
    """`value` validated as `model`, or `BadRequest` naming what does not fit."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise BadRequest(describe(exc, prefix)) from None


# --- the parts of a Pod that Pilotfish reads ------------------------------------------------

# Whatever the one quantity parser reads (the API server's grammar, any stored length, any
# sign: the API server validates signs after the mutating webhooks have run, and its own
# message is the better one). Magnitude is the parser's business, not the wire's. One
# validator rather than a union, so a misfit is one message rather than one per branch.
QUANTITY_RULE: Final = (
    "must be a quantity such as 500m or 4Gi (a string in the API server's grammar) or a number"
)


def _quantity(value: Any) -> str | int | float:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        try:
            quantity.nanos(value)
        except QuantityError:
            pass
        else:
            return value
    raise ValueError(QUANTITY_RULE)


Quantity = Annotated[str | int | float, PlainValidator(_quantity)]
ResourceList = dict[str, Quantity]
Labels = dict[str, str]


class OwnerReference(Strict):
    api_version: str | None = None
    kind: str | None = None
    name: str | None = None
    uid: str | None = None
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(Strict):
    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: Labels | None = None
    annotations: Labels | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None


class ResourceRequirements(Strict):
    requests: ResourceList | None = None
    limits: ResourceList | None = None
    claims: list[dict[str, Any]] | None = None


class Container(Strict):
    name: str | None = None
    image: str | None = None
    restart_policy: str | None = None
    resources: ResourceRequirements | None = None


class SchedulingGate(Strict):
    name: str


class Toleration(Strict):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class PodSpec(Strict):
    # Required, at least one: the API server never stores a pod without a container.
    containers: Annotated[list[Container], Field(min_length=1)]
    init_containers: list[Container] | None = None
    ephemeral_containers: list[Container] | None = None
    overhead: ResourceList | None = None
    resources: ResourceRequirements | None = None
    scheduling_gates: list[SchedulingGate] | None = None
    priority_class_name: str | None = None
    priority: int | None = None
    preemption_policy: str | None = None
    scheduler_name: str | None = None
    node_name: str | None = None
    node_selector: Labels | None = None
    service_account_name: str | None = None
    tolerations: list[Toleration] | None = None
    affinity: dict[str, Any] | None = None


class PodStatus(Strict):
    phase: str | None = None
    start_time: str | None = None
    conditions: list[dict[str, Any]] | None = None


class Pod(Strict):
    """Metadata and spec are required: every Pod the API server sends has both, and the
    reviews' patches (`/spec/priorityClassName`, `/metadata/labels/...`) assume them."""

    api_version: str | None = None
    kind: str | None = None
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus | None = None


_POD: Final = TypeAdapter(Pod)


def check_pod(value: Any, where: str) -> dict[str, Any]:
    """`value` if it is a JSON object shaped like a Pod where Pilotfish reads it."""
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be a JSON object (a Pod), got {kind_of(value)}")
    try:
        _POD.validate_python(value)
    except ValidationError as exc:
        raise BadRequest(describe(exc, where)) from None
    return value
