"""AdmissionReview (`admission.k8s.io/v1`) in and out, and the `Decision` a review returns.

Review functions decide; this module alone knows how a decision is spelled on the wire:
a denial as `allowed: false` with a Status the API server shows to the user verbatim, a
mutation as a base64 JSONPatch. Keeping that here means no webhook can forget the uid
echo, send a patch with a denial, or deny without saying why.
"""

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import StringConstraints

from pilotfish.httpserver import BadRequest
from pilotfish.wireshape import Strict, check, check_pod, kind_of

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
# The API server sends a UUID (36 characters); anything much longer is not from it.
MAX_UID_LENGTH: Final = 128

Json = dict[str, Any]
JsonPatchOp = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one review. Build it with `allow`, `deny` or `mutate`.

    Invariants are checked on construction because a malformed answer is worse than an
    exception: the API server would apply the webhook's failurePolicy to an error, but it
    would act on a denial without a message or a patch attached to a denial.
    """

    allowed: bool = True
    message: str = ""
    code: int = 200
    reason: str = ""
    patch: tuple[JsonPatchOp, ...] = ()
    warnings: tuple[str, ...] = ()
    # Whole seconds the client should wait before it asks again (a 429's Retry-After).
    retry_after: int | None = None

    def __post_init__(self) -> None:
        if self.allowed:
            return
        if not self.message:
            raise ValueError("a denial must say why: message is empty")
        if self.patch:
            raise ValueError("a denial cannot carry a patch")
        if not 400 <= self.code <= 599:
            raise ValueError(f"a denial needs an HTTP error code, got {self.code}")

    @classmethod
    def allow(cls, warnings: Iterable[str] = ()) -> "Decision":
        return cls(warnings=tuple(warnings))

    @classmethod
    def deny(
        cls,
        message: str,
        *,
        code: int = 403,
        reason: str = "Forbidden",
        retry_after: int | None = None,
    ) -> "Decision":
        """Refuse with a message that names the rule and the amount, e.g. which quota;
        `retry_after` seconds become the Status's details.retryAfterSeconds, which the API
        server answers as a Retry-After header."""
        return cls(
            allowed=False, message=message, code=code, reason=reason, retry_after=retry_after
        )

    @classmethod
    def mutate(cls, patch: Iterable[JsonPatchOp], warnings: Iterable[str] = ()) -> "Decision":
        """Allow with RFC 6902 operations; an empty patch is a plain allow."""
        return cls(patch=tuple(patch), warnings=tuple(warnings))

    @property
    def label(self) -> str:
        """The `decision` label of pilotfish_webhooks_reviews_total."""
        if not self.allowed:
            return "deny"
        return "patch" if self.patch else "allow"


class GroupVersionKind(Strict):
    group: str
    version: str
    kind: str


class GroupVersionResource(Strict):
    group: str
    version: str
    resource: str


class UserInfo(Strict):
    username: str | None = None
    uid: str | None = None
    groups: list[str] | None = None
    extra: dict[str, list[str]] | None = None


class AdmissionRequest(Strict):
    """`admission.k8s.io/v1` AdmissionRequest: what the API server always sends is required."""

    uid: Annotated[str, StringConstraints(min_length=1, max_length=MAX_UID_LENGTH)]
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str | None = None
    request_kind: GroupVersionKind | None = None
    request_resource: GroupVersionResource | None = None
    request_sub_resource: str | None = None
    name: str | None = None
    namespace: str | None = None
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    user_info: UserInfo | None = None
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool | None = None
    options: dict[str, Any] | None = None


class AdmissionReview(Strict):
    """Only v1: the chart registers `admissionReviewVersions: ["v1"]`, so anything else is a
    misconfiguration that should fail loudly rather than be half-understood."""

    api_version: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class InvalidObject(BadRequest):
    """A sound AdmissionReview whose Pod is not one Pilotfish can read.

    Answered as a denial naming the field rather than as HTTP 400: the API server shows a
    denial's message to the user verbatim, while a 400 reads as "failed calling webhook".
    """

    def __init__(self, uid: str, message: str) -> None:
        super().__init__(message)
        self.uid = uid


def parse_review(body: Any) -> Json:
    """Check the AdmissionReview and return its `request`, as decoded.

    Beyond the envelope, a Pod in `object` or `oldObject` is checked against the shape the
    pod reviews read (`pilotfish.wireshape.Pod`), so a review never meets a list where it
    reads a dict. Other kinds are the business of their review, which parses them with the
    API models. Every misfit raises `BadRequest` naming the field (`InvalidObject` when
    only the Pod is at fault).
    """
    if not isinstance(body, dict):
        raise BadRequest(f"AdmissionReview must be a JSON object, got {kind_of(body)}")
    review = check(AdmissionReview, body)
    request: Json = body["request"]
    if review.request.kind.group == "" and review.request.kind.kind == "Pod":
        for field in ("object", "oldObject"):
            if request.get(field) is not None:
                try:
                    check_pod(request[field], f"request.{field}")
                except BadRequest as exc:
                    raise InvalidObject(review.request.uid, str(exc)) from None
    return request


def encode_patch(patch: Iterable[JsonPatchOp]) -> str:
    """Base64 of the JSON array, as AdmissionResponse.patch ([]byte in Go) requires."""
    raw = json.dumps(list(patch), separators=(",", ":")).encode()
    return base64.b64encode(raw).decode("ascii")


def build_response(uid: str, decision: Decision) -> Json:
    """The full AdmissionReview answer for the request with this uid."""
    response: Json = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "code": decision.code,
            "reason": decision.reason,
            "message": decision.message,
        }
        if decision.retry_after is not None:
            response["status"]["details"] = {"retryAfterSeconds": decision.retry_after}
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode_patch(decision.patch)
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}
