"""Building blocks shared by every Pilotfish CRD model.

The models are the single source of the CRD schemas (`pilotfish.api.crdgen` turns them into
YAML), so each building block carries two things that must agree: the Python validation that
operators and tests rely on, and the OpenAPI fragment the API server enforces. Keeping both
in one place is what stops them drifting apart.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PlainSerializer,
    Strict,
    StringConstraints,
    Tag,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel, to_snake
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from pilotfish import quantity
from pilotfish.names import GROUP
from pilotfish.timeutil import format_time

# Patterns the API server itself uses for the same kinds of values, so that a value Python
# accepts is one the API server accepts too.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
QUALIFIED_NAME_PATTERN = rf"^({_SUBDOMAIN}/)?{_NAME}$"
PREFIXED_NAME_PATTERN = rf"^{_SUBDOMAIN}/{_NAME}$"
NAME_PREFIX_PATTERN = rf"^{_SUBDOMAIN}/$"
# resource.Quantity as the API server parses it, without a leading minus (no Pilotfish
# amount is negative); see `pilotfish.quantity`, which reads every string it matches.
QUANTITY_PATTERN = quantity.PATTERN
PERCENT_PATTERN = r"^[0-9]+%$"
IANA_SVC_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

# A qualified name is at most a 253-character DNS subdomain, a slash and a 63-character name.
QUALIFIED_NAME_MAX = 253 + 1 + 63


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` rule and its Python twin.

    Declared once, on the model (`cel_rules = (...)`), so that the CRD and the Python model
    reject the same objects with the same message. `holds` receives the validated model
    instance the rule is attached to (CEL's `self`); `field_path` is relative to it.
    """

    rule: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str | None = None

    def to_openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        return out


def _schema_extras(schema: dict[str, Any], cls: type[Any]) -> None:
    extra: dict[str, Any] = getattr(cls, "schema_extra", {})
    schema.update(extra)
    rules: tuple[CelRule, ...] = getattr(cls, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_openapi() for rule in rules]


class ApiModel(BaseModel):
    """Base of every Pilotfish API model.

    camelCase on the wire and snake_case in Python, so objects from the API server parse
    as they are and `model_dump(by_alias=True)` builds bodies the API server accepts.
    Strict types, because the API server does not coerce either: `replicas: "3"` is an
    error there and must be one here. Unknown fields are ignored rather than rejected, like
    every Kubernetes client does, so that an operator still reads objects written against
    a newer CRD during an upgrade.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        strict=True,
        extra="ignore",
        json_schema_extra=_schema_extras,
    )

    # CEL rules that hold for this object, mirrored in Python (see CelRule).
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()
    # Extra OpenAPI keys for this object's schema (x-kubernetes-* extensions).
    schema_extra: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Self:
        for rule in type(self).cel_rules:
            if not rule.holds(self):
                raise ValueError(rule.message)
        return self


@dataclass(frozen=True)
class ListSet:
    """Marks a list of scalars whose items are unique (`x-kubernetes-list-type: set`).

    The API server rejects duplicates and server-side apply merges item by item; Python
    rejects duplicates too so that nothing Python builds is refused later.
    """

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_unique_scalars, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out["x-kubernetes-list-type"] = "set"
        return out


def _unique_scalars(items: list[Any]) -> list[Any]:
    seen: set[Any] = set()
    for item in items:
        if item in seen:
            raise ValueError(f"duplicate value {item!r}")
        seen.add(item)
    return items


@dataclass(frozen=True)
class ListMap:
    """Marks a list of objects keyed by some of their fields (`x-kubernetes-list-type: map`).

    Keys are wire (camelCase) names. Besides uniqueness, this is what lets server-side
    apply merge one entry (one gate, one condition) without replacing the whole list.
    """

    keys: tuple[str, ...]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._unique, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out["x-kubernetes-list-type"] = "map"
        out["x-kubernetes-list-map-keys"] = list(self.keys)
        return out

    def _unique(self, items: list[Any]) -> list[Any]:
        seen: set[tuple[Any, ...]] = set()
        for item in items:
            key = tuple(getattr(item, to_snake(k)) for k in self.keys)
            if key in seen:
                shown = ", ".join(f"{k}={v!r}" for k, v in zip(self.keys, key, strict=True))
                raise ValueError(f"duplicate entry with {shown}")
            seen.add(key)
        return items


# metav1.Time: RFC 3339 with second precision. Parsed from the wire's strings (hence not
# strict), always serialised back to a string so that `model_dump` output is a valid body.
Time = Annotated[
    AwareDatetime,
    Strict(False),
    PlainSerializer(format_time, return_type=str),
]


def int_or_string_schema(**validations: Any) -> dict[str, Any]:
    # The only union a structural schema allows: exactly this anyOf, with every other
    # validation beside it (JSON Schema applies `pattern` only to strings and `minimum`
    # only to numbers, so one node constrains both branches).
    return {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        **validations,
    }


def _int_or_string_tag(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "int"
    return "string" if isinstance(value, str) else None


def int_or_string(expected: str) -> Discriminator:
    """Validate an int-or-string by the value's own type, so a bad value gets one error
    naming what was expected, not one error per branch of the union."""
    return Discriminator(
        _int_or_string_tag,
        custom_error_type="int_or_string",
        custom_error_message=f"Input should be {expected}",
    )


# resource.Quantity, never negative: an integer or a string such as "500m" or "4Gi". Amounts
# beyond any sane bound (quantity.MAX) match too: the TeamQuota webhook refuses them by name.
Quantity = Annotated[
    Annotated[Annotated[int, Field(ge=0)], Tag("int")]
    | Annotated[
        Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=quantity.MAX_LENGTH)],
        Tag("string"),
    ],
    int_or_string("an integer or a quantity string such as 500m or 4Gi"),
    WithJsonSchema(
        int_or_string_schema(pattern=QUANTITY_PATTERN, minimum=0, maxLength=quantity.MAX_LENGTH)
    ),
]

# An int-or-string that is a non-negative count or a percentage, as in a Deployment's strategy.
IntOrPercent = Annotated[
    Annotated[Annotated[int, Field(ge=0)], Tag("int")]
    | Annotated[
        Annotated[str, StringConstraints(pattern=PERCENT_PATTERN, max_length=8)], Tag("string")
    ],
    int_or_string("an integer or a percentage such as 25%"),
    WithJsonSchema(int_or_string_schema(pattern=PERCENT_PATTERN, minimum=0, maxLength=8)),
]

TeamName = Annotated[str, StringConstraints(pattern=DNS_LABEL_PATTERN, max_length=63)]
Band = Literal["production", "batch", "best-effort"]
ConditionStatus = Literal["True", "False", "Unknown"]
LabelMap = dict[str, str]


def object_field(factory: Callable[[], Any], description: str) -> Any:
    """A nested object that is always there, its own fields defaulted.

    The schema default `{}` makes the API server fill in the nested defaults when the field
    is left out, exactly as `default_factory` does in Python; without it the two disagree.
    Typed Any, as pydantic's Field() is.
    """
    return Field(
        default_factory=factory, description=description, json_schema_extra={"default": {}}
    )


def list_field(description: str) -> Any:
    """A list that is empty rather than absent, in Python and on the API server alike."""
    return Field(default_factory=list, description=description, json_schema_extra={"default": []})


class OwnerReference(ApiModel):
    """An owner of this object, for garbage collection and for finding the controller."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(ApiModel):
    """The fields of metav1.ObjectMeta that Pilotfish reads or writes.

    Everything else the API server sends (managedFields, ...) is kept as-is, so parsing
    and dumping an object does not lose what another writer put there.
    """

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    labels: LabelMap | None = None
    annotations: LabelMap | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None


class PodTemplateMetadata(ApiModel):
    """Labels and annotations copied onto every pod created from the template."""

    model_config = ConfigDict(extra="allow")
    schema_extra = {"x-kubernetes-preserve-unknown-fields": True}

    labels: LabelMap | None = Field(default=None, description="Labels set on every pod.")
    annotations: LabelMap | None = Field(default=None, description="Annotations set on every pod.")


class PodTemplate(ApiModel):
    """The pods to run: a core/v1 PodTemplateSpec (metadata and spec).

    The pod spec is kept as an opaque object: the API server validates it fully when a pod
    is created from it, and copying the whole Pod schema into each CRD would make them
    huge and pin them to one Kubernetes version.
    """

    model_config = ConfigDict(extra="allow")
    schema_extra = {
        "x-kubernetes-preserve-unknown-fields": True,
        "x-kubernetes-embedded-resource": False,
    }

    metadata: PodTemplateMetadata = object_field(
        PodTemplateMetadata, "Labels and annotations of the pods."
    )
    spec: dict[str, Any] = Field(
        description="A core/v1 PodSpec: containers, volumes, and so on "
        "(see `kubectl explain pod.spec`).",
    )


class Condition(ApiModel):
    """A metav1.Condition: one aspect of the object's state, as the controller last saw it."""

    type: str = Field(
        pattern=QUALIFIED_NAME_PATTERN,
        max_length=QUALIFIED_NAME_MAX,
        description="Type of condition in CamelCase, such as Available.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        pattern=CONDITION_REASON_PATTERN,
        min_length=1,
        max_length=1024,
        description="Programmatic identifier of the cause of the last transition, in CamelCase.",
    )
    message: str = Field(
        default="",
        max_length=32768,
        description="Human-readable details of the last transition.",
    )
    last_transition_time: Time = Field(
        description="When the status last changed from one value to another.",
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="metadata.generation the condition was computed from.",
    )


Conditions = Annotated[list[Condition], ListMap(keys=("type",))]


class ConditionsStatus(ApiModel):
    """A status with conditions and the generation they were computed from."""

    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="metadata.generation most recently acted on by the controller.",
    )
    conditions: Conditions = list_field(
        "Current state of the object, one entry per condition type."
    )

    def condition(self, type_: str) -> Condition | None:
        """Conditions are a list on the wire but keyed by type; look one up by its key."""
        return next((c for c in self.conditions if c.type == type_), None)


class LabelSelectorRequirement(ApiModel):
    """One label requirement: key, operator and values."""

    cel_rules = (
        CelRule(
            rule="self.operator in ['In', 'NotIn'] ? "
            "(has(self.values) && size(self.values) > 0) : "
            "(!has(self.values) || size(self.values) == 0)",
            message="values must be non-empty for In and NotIn, and empty for Exists "
            "and DoesNotExist",
            holds=lambda s: bool(s.values) == (s.operator in ("In", "NotIn")),
        ),
    )

    key: str = Field(
        pattern=QUALIFIED_NAME_PATTERN,
        max_length=QUALIFIED_NAME_MAX,
        description="The label key the requirement applies to.",
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the key relates to the values.",
    )
    values: list[Annotated[str, StringConstraints(max_length=63)]] | None = Field(
        default=None,
        max_length=64,
        description="Values for In and NotIn; must be empty for Exists and DoesNotExist.",
    )


class LabelSelector(ApiModel):
    """A metav1.LabelSelector; an empty selector selects everything."""

    match_labels: LabelMap | None = Field(
        default=None,
        description="Labels that must all be present with these values.",
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None,
        max_length=32,
        description="Requirements that must all hold.",
    )

    def matches(self, labels: LabelMap) -> bool:
        """Selection is evaluated in webhooks and operators alike; one implementation."""
        for key, value in (self.match_labels or {}).items():
            if labels.get(key) != value:
                return False
        for req in self.match_expressions or []:
            present = req.key in labels
            if req.operator == "In" and labels.get(req.key) not in (req.values or []):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in (req.values or []):
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


@dataclass(frozen=True)
class PrinterColumn:
    """An `additionalPrinterColumns` entry: what `kubectl get` shows."""

    name: str
    type: Literal["integer", "number", "string", "boolean", "date"]
    json_path: str
    description: str
    priority: int = 0

    def to_openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description,
        }
        if self.priority:
            out["priority"] = self.priority
        return out


AGE_COLUMN = PrinterColumn(
    "Age", "date", ".metadata.creationTimestamp", "Time since the object was created."
)


@dataclass(frozen=True)
class ScaleSubresource:
    """Paths of the scale subresource (`kubectl scale`, autoscalers)."""

    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str | None = None


@dataclass(frozen=True)
class CrdInfo:
    """What a CRD needs besides the schema: names, scope, subresources, columns."""

    plural: str
    short_names: tuple[str, ...]
    scope: Literal["Namespaced", "Cluster"]
    printer_columns: tuple[PrinterColumn, ...]
    scale: ScaleSubresource | None = None

    @property
    def name(self) -> str:
        """The CRD's metadata.name, which the API server requires to be plural.group."""
        return f"{self.plural}.{GROUP}"

    @property
    def namespaced(self) -> bool:
        return self.scope == "Namespaced"


class Resource(ApiModel):
    """A top-level Pilotfish object (apiVersion, kind, metadata, spec, status)."""

    crd: ClassVar[CrdInfo]

    metadata: ObjectMeta = Field(
        default_factory=ObjectMeta,
        description="Standard object metadata.",
    )

    @classmethod
    def kind_name(cls) -> str:
        """The kind is the class name, so it cannot drift from the `kind` field."""
        return cls.__name__


def is_zero_int_or_percent(value: int | str) -> bool:
    """Python twin of `zero_int_or_percent_cel`."""
    if isinstance(value, int):
        return value == 0
    return re.fullmatch(r"0+%", value) is not None


def zero_int_or_percent_cel(expr: str) -> str:
    """CEL that is true when an int-or-string field holds 0 or a zero percentage."""
    return f"(type({expr}) == int ? {expr} == 0 : {expr}.matches('^0+%$'))"
