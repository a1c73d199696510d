"""The factory shares one informer per view."""

from __future__ import annotations

from typing import Any, cast

from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.rest import NODES, PODS, Rest


def test_same_view_same_informer_other_view_other_informer() -> None:
    f = InformerFactory(cast(Rest, object()))
    a = f.get(PODS, label_selector="x=y")
    assert f.get(PODS, label_selector="x=y") is a
    assert f.get(PODS) is not a
    assert f.get(NODES) is not f.get(PODS)
    assert a.resync_seconds == f.resync_seconds


def test_informer_replays_list_differences_as_events() -> None:
    inf = InformerFactory(cast(Rest, object())).get(PODS)
    seen: list[tuple[str, str]] = []
    inf.add_handler(lambda kind, obj, _old: seen.append((kind, obj["metadata"]["name"])))

    def pod(name: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "n", "resourceVersion": rv}}

    inf._apply({"type": "ADDED", "object": pod("a", "1")})
    inf._apply({"type": "MODIFIED", "object": pod("a", "2")})
    inf._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    inf._apply({"type": "DELETED", "object": pod("a", "3")})
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert inf.resource_version == "3" and inf.store == {}


class FakeRest:
    """Answers list calls from a mutable list of items."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.rv = "1"

    async def list_pages(self, path: str, params: Any = None, page: int = 500) -> Any:
        return [dict(i, metadata=dict(i["metadata"])) for i in self.items], self.rv


async def test_relist_after_gone_emits_what_changed_meanwhile() -> None:
    rest = FakeRest()

    def pod(name: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "n", "resourceVersion": rv}}

    rest.items = [pod("a", "1"), pod("b", "1")]
    inf = InformerFactory(cast(Rest, rest)).get(PODS)
    seen: list[tuple[str, str]] = []
    inf.add_handler(lambda kind, obj, _old: seen.append((kind, obj["metadata"]["name"])))
    await inf.relist()
    rest.items = [pod("b", "5"), pod("c", "5")]  # a deleted, b changed, c added while away
    rest.rv = "5"
    await inf.relist()
    assert seen == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "b"),
        ("ADDED", "c"),
        ("DELETED", "a"),
    ]
    assert set(inf.store) == {"n/b", "n/c"} and inf.synced.is_set()
