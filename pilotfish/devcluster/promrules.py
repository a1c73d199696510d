"""The chart's PrometheusRules as plain Prometheus rule files.

A Prometheus without the Prometheus Operator (the dev cluster's, `promtool test rules`) reads
rule files, not PrometheusRule objects. Rendering them from the chart with the pinned helm,
rather than keeping a copy, means the alerts tested and loaded locally are exactly the ones
the chart ships.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pilotfish import names
from pilotfish.devcluster import binaries

TEMPLATE = "templates/prometheusrules.yaml"
# Rendering asks for the Prometheus Operator's API: the template renders nothing without it.
CAPABILITY = "monitoring.coreos.com/v1"


class RenderError(RuntimeError):
    pass


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as `|` blocks, so a rule file reads like the template."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def chart_dir() -> Path:
    root = binaries.checkout_root()
    if root is None:
        raise RenderError(
            "the chart's rules are rendered from a source checkout's charts/pilotfish"
        )
    return root / "charts" / "pilotfish"


def _helm_env() -> dict[str, str]:
    """Helm's cache and config go to a scratch directory: rendering must not touch $HOME."""
    home = Path(tempfile.gettempdir()) / "pilotfish-helm"
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def render_objects(
    set_values: Mapping[str, str] | None = None, bins: Path | None = None
) -> list[dict[str, Any]]:
    """The chart's PrometheusRule objects, rules enabled, with `set_values` as `--set`s."""
    helm = binaries.helm(bins if bins is not None else binaries.bin_dir())
    args = [
        str(helm), "template", "pilotfish", str(chart_dir()), "-n", names.SYSTEM_NAMESPACE,
        "-s", TEMPLATE, "--api-versions", CAPABILITY,
        "--set", "metrics.prometheusRules.enabled=true",
    ]  # fmt: skip
    for key, value in (set_values or {}).items():
        args += ["--set", f"{key}={value}"]
    res = subprocess.run(
        args, capture_output=True, text=True, env=_helm_env(), check=False, timeout=120
    )
    if res.returncode != 0:
        raise RenderError(f"helm template {TEMPLATE} failed:\n{res.stderr.strip()}")
    docs = [d for d in yaml.safe_load_all(res.stdout) if isinstance(d, dict)]
    return [d for d in docs if d.get("kind") == "PrometheusRule"]


def render_rule_files(
    out_dir: Path, set_values: Mapping[str, str] | None = None, bins: Path | None = None
) -> list[Path]:
    """One `<PrometheusRule name>.rules.yaml` per object (its `spec`: the groups) in `out_dir`.

    `set_values` are chart values (`--set key=value`), e.g. a short
    `metrics.prometheusRules.stalledFor` so a test can wait an alert's `for` out. Rule files
    from an earlier render that the chart no longer has are removed, so a Prometheus reading
    `out_dir/*.rules.yaml` never keeps a deleted alert.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for obj in render_objects(set_values, bins):
        name = obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        if not spec.get("groups"):
            raise RenderError(f"PrometheusRule {name}: spec.groups is empty")
        path = out_dir / f"{name}.rules.yaml"
        tmp = path.with_suffix(".tmp")
        text = yaml.dump({"groups": spec["groups"]}, Dumper=_Dumper, sort_keys=False, width=1000)
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    for stale in set(out_dir.glob("*.rules.yaml")) - set(written):
        stale.unlink()
    return written
