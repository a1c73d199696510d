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
from typing import Any, Final

from pilotfish.httpserver import BadRequest

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})

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
    def deny(cls, message: str, *, code: int = 403, reason: str = "Forbidden") -> "Decision":
        """Refuse with a message that names the rule and the amount, e.g. which quota."""
        return cls(allowed=False, message=message, code=code, reason=reason)

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


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def parse_review(body: Any) -> Json:
    """Check the AdmissionReview envelope and return its `request`.

    Only v1 is accepted: the chart registers `admissionReviewVersions: ["v1"]`, so anything
    else is a misconfiguration that should fail loudly rather than be half-understood.
    """
    if not isinstance(body, dict):
        raise BadRequest(f"AdmissionReview must be a JSON object, got {_kind(body)}")
    if body.get("apiVersion") != API_VERSION:
        raise BadRequest(f"apiVersion must be {API_VERSION!r}, got {body.get('apiVersion')!r}")
    if body.get("kind") != KIND:
        raise BadRequest(f"kind must be {KIND!r}, got {body.get('kind')!r}")
    request = body.get("request")
    if not isinstance(request, dict):
        raise BadRequest(f"request is missing or not an object (got {_kind(request)})")
    uid = request.get("uid")
    if type(uid) is not str or not uid:
        raise BadRequest("request.uid is missing")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise BadRequest(
            f"request.operation must be one of {sorted(OPERATIONS)}, got {operation!r}"
        )
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
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode_patch(decision.patch)
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}
