"""One in-memory API server for unit tests, behind the real `Rest` interface.

Unit tests drive the real controllers on their real informers and factory; only the
HTTP server is replaced, and it keeps the API server's rules that Pilotfish relies on:

- resourceVersions are opaque strings, fresh on every write (tests must not order them);
- optimistic concurrency: a body or merge/strategic patch carrying `metadata.resourceVersion`,
  a JSON patch `test` op, or delete preconditions (uid, resourceVersion) that no longer hold
  answer 409 (422 for a failed `test`), and nothing is written;
- subresources: a write to `/status` changes only status (a node's metadata too, as the
  API server's node status strategy allows), a write to the object never does;
  `metadata.generation` grows when anything but metadata and status changes;
- merge (RFC 7386), strategic merge (lists of named items merged by name or type, `$patch:
  delete`), and JSON patch (add, replace, remove, test);
- list with label and field selectors, paginated; watch from a resourceVersion, replaying
  what happened since, `410 Gone` once `compact()` dropped that history;
- `pods/eviction`: an Eviction (policy/v1) deletes the pod as a delete would, honouring a
  uid precondition, and answers 201; a test arranges a budget's 429 with
  `fail_next("POST", "/eviction", 429, body=eviction_refused("web"))`;
- `dryRun=All` writes are checked and answered as real ones, and change nothing;
- a log of every request; faults: `fail_next(method, path_part, status)`, optionally with
  the Status body the API server would send (method "WATCH" fails a watch); races:
  `before(method, path_part, action)` runs `action` (another writer's change) right before
  a matching request.

`await api.settle()` returns once every open watch has delivered every event so far, so a
test can write and then assert on what the informers saw, without sleeping.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pilotfish.kube.rest import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiError, Rest

Obj = dict[str, Any]
_uids = itertools.count(1)


@dataclass(frozen=True)
class Ref:
    """What a path names: a collection (name None) or one object, maybe a subresource."""

    group_version: str
    plural: str
    namespace: str | None
    name: str | None
    sub: str | None


def parse_path(path: str) -> Ref:
    parts = [p for p in path.split("?", maxsplit=1)[0].strip("/").split("/") if p]
    if parts[0] == "api":
        gv, rest = parts[1], parts[2:]
    else:
        gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    ns: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return Ref(gv, plural, ns, name, sub)


def key_of(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


@dataclass
class _Event:
    rv: int
    kind: str
    collection: tuple[str, str]
    obj: Obj


@dataclass
class _Fault:
    method: str
    path_part: str
    status: int
    times: int
    commit_first: bool
    body: Obj | None = None


@dataclass
class Call:
    method: str
    path: str
    body: Any
    content_type: str
    params: dict[str, Any] = field(default_factory=dict)
    request_timeout: float | None = None


def _labels_match(labels: Mapping[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif " in (" in term:
            k, vals = term.split(" in (", 1)
            if labels.get(k.strip()) not in {v.strip() for v in vals.rstrip(")").split(",")}:
                return False
        elif term not in labels:
            return False
    return True


def _field(obj: Obj, dotted: str) -> str:
    cur: Any = obj
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _fields_match(obj: Obj, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if _field(obj, k) == v:
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if _field(obj, k) != v:
                return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _merge_key(items: list[Any]) -> str | None:
    for k in ("name", "type", "containerPort", "port"):
        if items and all(isinstance(i, dict) and k in i for i in items):
            return k
    return None


def strategic_merge(target: Any, patch: Any) -> Any:
    if isinstance(patch, list):
        key = _merge_key([p for p in patch if isinstance(p, dict)] or [None])
        if key is None or not isinstance(target, list):
            return [p for p in copy.deepcopy(patch) if not _is_delete(p)]
        out = [copy.deepcopy(t) for t in target]
        for p in patch:
            idx = next((i for i, t in enumerate(out) if t.get(key) == p.get(key)), None)
            if _is_delete(p):
                if idx is not None:
                    del out[idx]
            elif idx is None:
                out.append(copy.deepcopy(p))
            else:
                out[idx] = strategic_merge(out[idx], p)
        return out
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged: Obj = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = strategic_merge(merged.get(k), v)
    return merged


def _is_delete(p: Any) -> bool:
    return isinstance(p, dict) and p.get("$patch") == "delete"


def _pointer(path: str) -> list[str]:
    return [s.replace("~1", "/").replace("~0", "~") for s in path.strip("/").split("/")]


def json_patch(obj: Obj, ops: list[Obj]) -> Obj:
    out = copy.deepcopy(obj)
    for op in ops:
        segs = _pointer(op["path"])
        parent: Any = out
        for s in segs[:-1]:
            parent = parent[int(s)] if isinstance(parent, list) else parent.setdefault(s, {})
        last = segs[-1]
        kind = op["op"]
        if kind == "test":
            here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if here != op["value"]:
                raise ApiError(422, "Invalid", f"the server rejected our request: test {op}")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", f"remove of a missing path {op['path']}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif kind == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = copy.deepcopy(op["value"])
        else:
            raise ApiError(422, "Invalid", f"unsupported op {kind}")
    return out


def _injected(fault: _Fault, message: str) -> ApiError:
    if fault.body is None:
        return ApiError(fault.status, "Injected", message)
    reason = str(fault.body.get("reason") or "Injected")
    return ApiError(fault.status, reason, str(fault.body.get("message") or message), fault.body)


def _conflict(what: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f"Operation cannot be fulfilled on {what}: the object has been modified; "
        "please apply your changes to the latest version and try again",
    )


class FakeApi(Rest):
    def __init__(self) -> None:  # no ApiClient: nothing goes over the wire
        self._rv = 1000
        self.objects: dict[tuple[str, str], dict[str, Obj]] = {}
        self.calls: list[Call] = []
        self._events: list[_Event] = []
        self._compacted = 0
        self._changed = asyncio.Condition()
        self._watchers: dict[int, int] = {}  # watcher id -> rv delivered up to
        self._faults: list[_Fault] = []
        self._before: list[tuple[str, str, Callable[[], object]]] = []
        self._watch_ids = itertools.count()
        self._closed = 0  # bumped by close_watches: every open watch ends
        self.impersonated: set[str] = set()  # users a client asked to act as
        self._notifying: set[asyncio.Future[None]] = set()

    # test-side helpers

    def store(self, group_version: str, plural: str) -> dict[str, Obj]:
        return self.objects.setdefault((group_version, plural), {})

    def obj(self, path: str) -> Obj | None:
        ref = parse_path(path)
        assert ref.name is not None
        found = self.store(ref.group_version, ref.plural).get(key_of(ref.namespace, ref.name))
        return copy.deepcopy(found) if found is not None else None

    def put(self, path: str, body: Obj) -> Obj:
        """Create or overwrite as someone else would (no preconditions, no log entry)."""
        ref = parse_path(path)
        meta = body.setdefault("metadata", {})
        if ref.namespace and "namespace" not in meta:
            meta["namespace"] = ref.namespace
        key = key_of(meta.get("namespace"), meta["name"])
        coll = (ref.group_version, ref.plural)
        old = self.store(*coll).get(key)
        obj = copy.deepcopy(body)
        self._stamp(obj, old)
        self.store(*coll)[key] = obj
        self._emit("ADDED" if old is None else "MODIFIED", coll, obj)
        return copy.deepcopy(obj)

    def remove(self, path: str) -> None:
        """Delete as someone else would."""
        ref = parse_path(path)
        assert ref.name is not None
        coll = (ref.group_version, ref.plural)
        obj = self.store(*coll).pop(key_of(ref.namespace, ref.name))
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._emit("DELETED", coll, obj)

    def fail_next(
        self,
        method: str,
        path_part: str,
        status: int,
        *,
        times: int = 1,
        commit_first: bool = False,
        body: Obj | None = None,
    ) -> None:
        """The next `times` requests of `method` whose path contains `path_part` fail with
        `status` (and the Status `body`, if given); `commit_first`: the write happens, then
        the answer is lost."""
        self._faults.append(_Fault(method, path_part, status, times, commit_first, body))

    def before(self, method: str, path_part: str, action: Callable[[], object]) -> None:
        """Run `action` (e.g. a `put` by another writer) just before the next request of
        `method` whose path contains `path_part` is served: a race, made deterministic."""
        self._before.append((method, path_part, action))

    def writes(self, path_part: str = "") -> list[Call]:
        return [
            c
            for c in self.calls
            if c.method in ("POST", "PUT", "PATCH", "DELETE") and path_part in c.path
        ]

    def compact(self) -> None:
        """Forget the watch history: a watch from an older resourceVersion gets 410 Gone."""
        self._compacted = self._rv
        self._events.clear()

    async def close_watches(self) -> None:
        """End every open watch cleanly (an API server restart, a watch timeout)."""
        self._closed += 1
        await self._notify()

    async def settle(self, within: float = 5.0) -> None:
        """Until every open watch has delivered every event so far, and handlers ran."""

        async def caught_up() -> None:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: all(rv >= self._rv for rv in self._watchers.values())
                )

        await asyncio.wait_for(caught_up(), within)
        for _ in range(3):
            await asyncio.sleep(0)

    # the API server

    def _stamp(self, obj: Obj, old: Obj | None) -> None:
        self._rv += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        if old is None:
            meta.setdefault("uid", f"uid-{next(_uids)}")
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            meta.setdefault("generation", 1)
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta.setdefault("creationTimestamp", old["metadata"].get("creationTimestamp"))
            spec_changed = {k: v for k, v in obj.items() if k not in ("metadata", "status")} != {
                k: v for k, v in old.items() if k not in ("metadata", "status")
            }
            meta["generation"] = int(old["metadata"].get("generation") or 1) + spec_changed

    def _emit(self, kind: str, coll: tuple[str, str], obj: Obj) -> None:
        self._events.append(_Event(self._rv, kind, coll, copy.deepcopy(obj)))
        task = asyncio.ensure_future(self._notify())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _fault(self, method: str, path: str) -> _Fault | None:
        for f in self._faults:
            if f.method == method and f.path_part in path:
                f.times -= 1
                if f.times <= 0:
                    self._faults.remove(f)
                return f
        return None

    def impersonating(self, user: str) -> Rest:
        """The same store: the fake authorizes nothing, it only remembers who was asked for."""
        self.impersonated.add(user)
        return self

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = 30.0,
    ) -> dict[str, Any]:
        self.calls.append(
            Call(
                method, path, copy.deepcopy(body), content_type, dict(params or {}), request_timeout
            )
        )
        for hook in self._before:
            if hook[0] == method and hook[1] in path:
                self._before.remove(hook)
                hook[2]()
                break
        await asyncio.sleep(0)  # the round trip: other tasks run while a request is out
        fault = self._fault(method, path)
        if fault is not None and not fault.commit_first:
            raise _injected(fault, f"injected {fault.status} for {path}")
        if method != "GET" and (params or {}).get("dryRun") == "All":
            return self._dry_run(method, path, dict(params or {}), body, content_type)
        out = self._serve(method, path, dict(params or {}), body, content_type)
        if fault is not None:
            raise _injected(fault, f"the answer to {path} was lost")
        return out

    def _dry_run(
        self, method: str, path: str, params: dict[str, Any], body: Any, content_type: str
    ) -> Obj:
        """Serve the write on a copy of the store: the same answer, nothing kept."""
        saved = copy.deepcopy(self.objects), self._rv, len(self._events)
        try:
            return self._serve(method, path, params, body, content_type)
        finally:
            self.objects, self._rv = saved[0], saved[1]
            del self._events[saved[2] :]

    def _serve(
        self, method: str, path: str, params: dict[str, Any], body: Any, content_type: str
    ) -> Obj:
        ref = parse_path(path)
        coll = (ref.group_version, ref.plural)
        items = self.store(*coll)
        if ref.name is None:
            if method == "GET":
                return self._list(ref, params)
            if method == "POST":
                return self._create(ref, coll, body)
            if method == "DELETE":  # deletecollection: the selected objects, as deleted
                deleted = []
                for k, o in sorted(items.items()):
                    if self._selected(ref, o, params):
                        answer = self._delete(ref, coll, k, o, body or {})
                        deleted.append(o if answer.get("kind") == "Status" else answer)
                return {"kind": "List", "metadata": {}, "items": copy.deepcopy(deleted)}
            raise ApiError(405, "MethodNotAllowed", f"{method} {path}")
        key = key_of(ref.namespace, ref.name)
        current = items.get(key)
        if current is None:
            raise ApiError(404, "NotFound", f'{ref.plural} "{ref.name}" not found')
        if method == "GET":
            return copy.deepcopy(current)
        if method == "POST" and ref.sub == "eviction":
            options = (body or {}).get("deleteOptions") or {}
            self._delete(ref, coll, key, current, options)
            return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        if method == "DELETE":
            return self._delete(ref, coll, key, current, body or {})
        if method == "PUT":
            new = copy.deepcopy(body)
            want = (new.get("metadata") or {}).get("resourceVersion")
            if want and want != current["metadata"]["resourceVersion"]:
                raise _conflict(f'{ref.plural} "{ref.name}"')
        elif method == "PATCH":
            new = self._patched(ref, current, body, content_type)
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} {path}")
        return self._update(ref, coll, key, current, new)

    def _patched(self, ref: Ref, current: Obj, body: Any, content_type: str) -> Obj:
        if content_type == JSON_PATCH:
            return json_patch(current, cast(list[Obj], body))
        if isinstance(body, (str, bytes)):
            body = json.loads(body)
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want and want != current["metadata"]["resourceVersion"]:
            raise _conflict(f'{ref.plural} "{ref.name}"')
        if content_type == MERGE_PATCH:
            return cast(Obj, merge_patch(current, body))
        if content_type == STRATEGIC_MERGE_PATCH:
            return cast(Obj, strategic_merge(current, body))
        raise ApiError(415, "UnsupportedMediaType", content_type)

    def _update(self, ref: Ref, coll: tuple[str, str], key: str, current: Obj, new: Obj) -> Obj:
        if ref.sub == "status":
            merged = copy.deepcopy(current)
            merged["status"] = new.get("status") or {}
            if ref.plural == "nodes":  # the node status strategy resets only spec
                merged["metadata"] = {**new.get("metadata", {})}
        else:
            merged = {k: v for k, v in new.items() if k != "status"}
            if "status" in current:
                merged["status"] = copy.deepcopy(current["status"])
            merged["metadata"] = {**new.get("metadata", {})}
        merged["metadata"].pop("resourceVersion", None)
        self._stamp(merged, current)
        meta = merged["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.store(*coll)[key]
            self._emit("DELETED", coll, merged)
        else:
            self.store(*coll)[key] = merged
            self._emit("MODIFIED", coll, merged)
        return copy.deepcopy(merged)

    def _create(self, ref: Ref, coll: tuple[str, str], body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(_uids):05x}"
        if ref.namespace:
            meta["namespace"] = ref.namespace
        key = key_of(meta.get("namespace"), meta["name"])
        if key in self.store(*coll):
            raise ApiError(409, "AlreadyExists", f'{ref.plural} "{meta["name"]}" already exists')
        meta.pop("resourceVersion", None)
        self._stamp(obj, None)
        self.store(*coll)[key] = obj
        self._emit("ADDED", coll, obj)
        return copy.deepcopy(obj)

    def _delete(self, ref: Ref, coll: tuple[str, str], key: str, current: Obj, body: Obj) -> Obj:
        pre = body.get("preconditions") or {}
        meta = current["metadata"]
        if pre.get("uid") not in (None, meta.get("uid")) or pre.get("resourceVersion") not in (
            None,
            meta.get("resourceVersion"),
        ):
            raise _conflict(f'{ref.plural} "{ref.name}" (precondition)')
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                new = copy.deepcopy(current)
                new["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                return self._update(ref, coll, key, current, new)
            return copy.deepcopy(current)
        del self.store(*coll)[key]
        self._rv += 1
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._emit("DELETED", coll, gone)
        return {"kind": "Status", "status": "Success", "details": {"name": ref.name}}

    def _selected(self, ref: Ref, obj: Obj, params: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if ref.namespace and meta.get("namespace") != ref.namespace:
            return False
        if params.get("labelSelector") and not _labels_match(
            meta.get("labels") or {}, str(params["labelSelector"])
        ):
            return False
        return not params.get("fieldSelector") or _fields_match(obj, str(params["fieldSelector"]))

    def _list(self, ref: Ref, params: Mapping[str, Any]) -> Obj:
        items = [
            copy.deepcopy(o)
            for _, o in sorted(self.store(ref.group_version, ref.plural).items())
            if self._selected(ref, o, params)
        ]
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 0) or len(items) or 1
        page = items[start : start + limit]
        meta: Obj = {"resourceVersion": str(self._rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {"kind": "List", "metadata": meta, "items": page}

    async def _wait_past(self, since: int, closed: int) -> None:
        async with self._changed:
            self._changed.notify_all()
            await self._changed.wait_for(lambda: self._rv > since or closed != self._closed)

    async def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, Any] | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[dict[str, Any]]:
        ref = parse_path(path)
        coll = (ref.group_version, ref.plural)
        q = dict(params or {})
        self.calls.append(Call("WATCH", path, None, "", q | {"resourceVersion": resource_version}))
        fault = self._fault("WATCH", path)
        if fault is not None:
            raise _injected(fault, f"injected {fault.status} for the watch of {path}")
        since = int(resource_version or self._rv)
        if since < self._compacted:
            raise ApiError(410, "Expired", f"too old resource version: {since}")
        me = next(self._watch_ids)
        self._watchers[me] = since
        closed = self._closed
        try:
            while closed == self._closed:
                pending = [e for e in self._events if e.rv > since]
                for e in pending:
                    since = e.rv
                    if e.collection == coll and self._selected(ref, e.obj, q):
                        yield {"type": e.kind, "object": copy.deepcopy(e.obj)}
                if any(e.rv > since for e in self._events):
                    continue  # written while we delivered
                since = max(since, self._rv)  # nothing in between (compacted history)
                self._watchers[me] = since
                await self._wait_past(since, closed)
        finally:
            self._watchers.pop(me, None)
            await self._notify()


def eviction_refused(budget: str, healthy: int = 1) -> Obj:
    """The Status body of the API server's 429 for an eviction a budget does not allow."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {budget} needs {healthy} healthy pods "
                    f"and has {healthy} currently",
                }
            ]
        },
        "code": 429,
    }


async def wait_for(what: str, check: Callable[[], Any], within: float = 5.0) -> Any:
    """Until `check()` returns something truthy (returned), looking again between the event
    loop's other tasks (informers, queues); an AssertionError naming `what` at the deadline."""
    try:
        async with asyncio.timeout(within):
            while not (value := check()):  # noqa: ASYNC110 - a condition, not an event
                await asyncio.sleep(0.01)
            return value
    except TimeoutError:
        raise AssertionError(f"timed out after {within}s waiting for {what}") from None
