"""Asking the e2e cluster's Prometheus: instant and range queries, alerts, waiting for series.

The local cluster's Prometheus listens on `ports.PROMETHEUS` shifted by the session's port
offset (`Env.prometheus_url`); against an external cluster PILOTFISH_E2E_PROMETHEUS_URL names
it, and tests that need it are skipped without one. Errors carry Prometheus's own text
("parse error: ...") so a bad expression fails the test with the reason.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from e2e.conftest import Env

TIMEOUT = 10.0


class PrometheusError(AssertionError):
    """Prometheus answered with an error (bad expression, timeout) or not at all."""


def _get(url: str, path: str, params: dict[str, str] | None = None) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    try:
        with urllib.request.urlopen(f"{url}{path}{query}", timeout=TIMEOUT) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read())
        except ValueError:
            raise PrometheusError(f"{path}: HTTP {e.code}") from e
    except (OSError, ValueError) as e:
        raise PrometheusError(f"{path}: {e}") from e
    if body.get("status") != "success":
        expr = (params or {}).get("query", "")
        raise PrometheusError(
            f"{path} {expr!r}: {body.get('errorType', 'error')}: {body.get('error', body)}"
        )
    return body["data"]


def url_of(env_or_url: Env | str) -> str:
    return env_or_url if isinstance(env_or_url, str) else env_or_url.prometheus_url


def query(env: Env | str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query's result: [{"metric": {...}, "value": [ts, "1.5"]}, ...].

    A scalar or string result comes back as one element with empty labels."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    data = _get(url_of(env), "/api/v1/query", params)
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    result: list[dict[str, Any]] = data["result"]
    return result


def query_range(
    env: Env | str, expr: str, start: float, end: float, step: float = 5.0
) -> list[dict[str, Any]]:
    """A range query's matrix: [{"metric": {...}, "values": [[ts, "1.5"], ...]}, ...]."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    result: list[dict[str, Any]] = _get(url_of(env), "/api/v1/query_range", params)["result"]
    return result


def value(sample: dict[str, Any]) -> float:
    """The float of one instant-query element."""
    return float(sample["value"][1])


def alerts(env: Env | str) -> list[dict[str, Any]]:
    """Active alerts (pending and firing): [{"labels": {"alertname": ...}, "state": ...}]."""
    result: list[dict[str, Any]] = _get(url_of(env), "/api/v1/alerts")["alerts"]
    return result


def rule_groups(env: Env | str) -> list[dict[str, Any]]:
    """The loaded rule groups (`/api/v1/rules`), with each rule's health and last error."""
    result: list[dict[str, Any]] = _get(url_of(env), "/api/v1/rules")["groups"]
    return result


def targets(env: Env | str) -> list[dict[str, Any]]:
    """Active scrape targets with their job, labels, health and last error."""
    result: list[dict[str, Any]] = _get(url_of(env), "/api/v1/targets", {"state": "active"})[
        "activeTargets"
    ]
    return result


def ready(env: Env | str) -> bool:
    try:
        with urllib.request.urlopen(f"{url_of(env)}/-/ready", timeout=TIMEOUT) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def wait_for_series(
    env: Env | str,
    expr: str,
    deadline: float = 60.0,
    check: Callable[[list[dict[str, Any]]], bool] | None = None,
    interval: float = 1.0,
) -> list[dict[str, Any]]:
    """Poll `expr` until it returns a non-empty result (and `check(result)` holds) within
    `deadline` seconds; fail naming the expression and the last result. Query errors fail at
    once: waiting does not fix a bad expression."""
    end = time.monotonic() + deadline
    last: list[dict[str, Any]] = []
    while True:
        try:
            last = query(env, expr)
        except PrometheusError as e:
            if "bad_data" in str(e):
                raise
            last = []
        if last and (check is None or check(last)):
            return last
        if time.monotonic() >= end:
            raise AssertionError(
                f"timed out after {deadline:.0f}s waiting for {expr!r} (last: {last!r})"
            )
        time.sleep(interval)
