"""The reclaim controller's settings: defaults, the environment, and errors naming the
variable, the value and the rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pilotfish.operators.reclaim.settings import ReclaimSettings, duration_seconds
from tests.test_dashboard_json import check_rules


def test_defaults_are_off_and_the_design_s() -> None:
    s = ReclaimSettings.from_env({})
    assert s == ReclaimSettings(None, 60.0, "1h", 0.10, 180.0)
    assert not s.enabled
    assert s.step == "60s"
    assert "[1h:60s]" in s.cpu_p95() and "rate(pod_cpu_usage_seconds_total[1m])" in s.cpu_p95()
    assert "sum by (node, namespace, pod) (pod_memory_working_set_bytes)" in s.memory_p95()
    assert s.freshness() == "time() - max by (node) (timestamp(node_memory_working_set_bytes))"


def test_the_environment_sets_each_value() -> None:
    s = ReclaimSettings.from_env(
        {
            "PILOTFISH_PROMETHEUS_URL": "http://127.0.0.1:19390",
            "PILOTFISH_RECLAIM_INTERVAL_SECONDS": "15",
            "PILOTFISH_RECLAIM_WINDOW": "2m",
            "PILOTFISH_RECLAIM_MARGIN": "0.2",
            "PILOTFISH_RECLAIM_STALE_AFTER_SECONDS": "30",
        }
    )
    assert s == ReclaimSettings("http://127.0.0.1:19390", 15.0, "2m", 0.2, 30.0)
    assert s.enabled and s.step == "2s"


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("PILOTFISH_PROMETHEUS_URL", "prometheus:9090", "http:// or https:// URL"),
        ("PILOTFISH_RECLAIM_INTERVAL_SECONDS", "soon", "must be a number"),
        ("PILOTFISH_RECLAIM_INTERVAL_SECONDS", "0.5", "at least 1"),
        ("PILOTFISH_RECLAIM_WINDOW", "an hour", "Prometheus duration"),
        ("PILOTFISH_RECLAIM_WINDOW", "30s", "at least 1m"),
        ("PILOTFISH_RECLAIM_WINDOW", "0h", "longer than 0"),
        ("PILOTFISH_RECLAIM_MARGIN", "1.5", "below 1"),
        ("PILOTFISH_RECLAIM_MARGIN", "-0.1", "at least 0"),
        ("PILOTFISH_RECLAIM_MARGIN", "nan", "finite"),
        ("PILOTFISH_RECLAIM_STALE_AFTER_SECONDS", "0", "above 0"),
    ],
)
def test_a_bad_value_names_the_variable_and_the_rule(name: str, value: str, rule: str) -> None:
    with pytest.raises(ValueError) as e:
        ReclaimSettings.from_env({name: value})
    assert name in str(e.value) and rule in str(e.value)


def test_durations_read_as_prometheus_reads_them() -> None:
    assert duration_seconds("X", "1h30m") == 5400
    assert duration_seconds("X", "90s") == 90
    with pytest.raises(ValueError, match="X='30m1h'"):
        duration_seconds("X", "30m1h")  # largest unit first


def test_usage_is_the_larger_of_the_p95_and_now() -> None:
    """A spike counts at the next cycle: each query takes the rate now where it is higher."""
    s = ReclaimSettings()
    assert "irate(pod_cpu_usage_seconds_total[2m])" in s.cpu_p95()
    assert s.cpu_p95().count(" or ") == 2 and " > " in s.cpu_p95()
    assert s.memory_p95().count(" or ") == 2 and " > " in s.memory_p95()


def test_the_queries_parse_with_the_real_promtool(tmp_path: Path) -> None:
    """A typo in a query would read as "Prometheus unavailable" on every node every cycle."""
    s = ReclaimSettings(window="2m")
    exprs = [s.cpu_p95(), s.memory_p95(), s.freshness()]
    rules = [{"record": f"reclaim:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "reclaim.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "reclaim", "rules": rules}]}))
    res = check_rules(path)
    assert res.returncode == 0, res.stdout + res.stderr
