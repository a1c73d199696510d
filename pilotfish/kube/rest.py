"""Raw-dict REST calls over the process's transport (`pilotfish.kube.transport`).

Hot paths skip the generated model classes (ARCHITECTURE section 3): bodies go out and come
back as plain dicts, errors come back as one exception type carrying the API's Status.
Every write that depends on what was read is conditional: callers pass the resourceVersion
they decided from (`metadata.resourceVersion` in the body, or a JSON-patch `test` op).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson

from pilotfish.kube.transport import Transport
from pilotfish.names import GROUP, VERSION

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class ApiError(Exception):
    """A non-2xx answer; `status`, `reason` and `message` come from the API's Status object."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}
        # Seconds the server asked the client to wait (Retry-After: API Priority and
        # Fairness sends it with a plain-text 429, admission with a Status).
        self.retry_after = retry_after

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def gone(self) -> bool:
        return self.status == 410


@dataclass(frozen=True)
class Resource:
    """One API resource: where it lives, e.g. ("", "v1", "pods") or ("pilotfish.io", ...)."""

    group: str
    version: str
    plural: str
    namespaced: bool = True
    subresources: tuple[str, ...] = field(default=())

    def path(
        self, namespace: str | None = None, name: str | None = None, sub: str | None = None
    ) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if sub:
            base += f"/{sub}"
        return base


PODS = Resource("", "v1", "pods")
NODES = Resource("", "v1", "nodes", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
LEASES = Resource("coordination.k8s.io", "v1", "leases")
EVENTS = Resource("events.k8s.io", "v1", "events")

# Pilotfish's own resources (group pilotfish.io), named once for every part.
SERVICEWORKLOADS = Resource(GROUP, VERSION, "serviceworkloads")
BATCHWORKLOADS = Resource(GROUP, VERSION, "batchworkloads")
GATEPOLICIES = Resource(GROUP, VERSION, "gatepolicies")
GATESIGNALS = Resource(GROUP, VERSION, "gatesignals")
TEAMQUOTAS = Resource(GROUP, VERSION, "teamquotas", namespaced=False)
NODEMAINTENANCES = Resource(GROUP, VERSION, "nodemaintenances", namespaced=False)


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    """The Retry-After header in seconds (the API server sends whole seconds); None when
    absent or not a positive number."""
    raw = (headers or {}).get("Retry-After")
    try:
        seconds = float(raw) if raw else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds < 3600 else None


def _error(status: int, raw: bytes, headers: Mapping[str, str] | None = None) -> ApiError:
    wait = _retry_after(headers)
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):  # not a Status: APF's plain-text 429, a proxy's page
        return ApiError(status, "Unknown", raw.decode(errors="replace")[:500], None, wait)
    reason, message = str(body.get("reason", "")), str(body.get("message", ""))
    return ApiError(status, reason, message, body, wait)


class Rest:
    """A thin raw-dict client; one per process, sharing the transport's connection pool."""

    def __init__(self, api: Transport, impersonate: str | None = None) -> None:
        self.api = api
        self.impersonate = impersonate

    def impersonating(self, user: str) -> Rest:
        """The same connection pool, every request made as `user` (`Impersonate-User`): the
        API server authorizes it, audits it and queues it (API Priority and Fairness) as
        `user`'s. The caller needs `impersonate` on that user, and nothing more."""
        return Rest(self.api, impersonate=user)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": JSON}
        if self.impersonate:
            headers["Impersonate-User"] = self.impersonate
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        request_timeout: float | None = 30.0,
    ) -> dict[str, Any]:
        headers = self._headers()
        if body is not None:
            headers["Content-Type"] = content_type
        resp = await self.api.send(
            method, path, params=params, headers=headers, body=body, request_timeout=request_timeout
        )
        raw = await resp.read()
        if resp.status >= 300:
            raise _error(resp.status, raw, resp.headers)
        out: dict[str, Any] = orjson.loads(raw) if raw else {}
        return out

    async def get(self, path: str, **params: Any) -> dict[str, Any]:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PUT", path, body=body)

    async def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> dict[str, Any]:
        return await self.request("PATCH", path, body=body, content_type=content_type)

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.request("DELETE", path, body=body)

    async def list_pages(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        page: int = 500,
        each: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """Every item, in pages of `page`; returns (items, resourceVersion of the list).

        `each` is applied to every item as its page arrives, so a caller that keeps a
        projection never holds more than one page of whole objects (at 30,000 pods the
        whole list is hundreds of megabytes the process would keep as heap)."""
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            q = {**(params or {}), "limit": page}
            if cont:
                q["continue"] = cont
            data = await self.request("GET", path, params=q, request_timeout=120)
            meta = data.get("metadata") or {}
            got = data.get("items") or []
            items.extend(map(each, got) if each is not None else got)
            del data, got
            cont = meta.get("continue")
            if not cont:
                return items, str(meta.get("resourceVersion", ""))

    async def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, Any] | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events (dicts with `type` and `object`) from `resource_version`, with bookmarks.

        An `ERROR` event is raised as ApiError (410 Gone means: relist).
        """
        q = {
            **(params or {}),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
        }
        resp = await self.api.send(
            "GET",
            path,
            params=q,
            headers=self._headers(),
            body=None,
            request_timeout=timeout_seconds + 30,
        )
        try:
            if resp.status >= 300:
                raise _error(resp.status, await resp.read(), resp.headers)
            async for line in resp.content:
                if not line.strip():
                    continue
                # orjson: every informer of the process decodes every event of its resource
                # here (the extender's pod watch was the largest part of its CPU).
                event: dict[str, Any] = orjson.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    raise ApiError(
                        int(obj.get("code", 500)),
                        str(obj.get("reason", "")),
                        str(obj.get("message", "")),
                        obj,
                    )
                yield event
        finally:
            resp.release()
