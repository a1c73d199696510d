"""report: every benchmark's figures in one table (benchmark, figure, target, measured, met,
load average), read from the JSON objects `make bench` wrote into `benchmarks/results/`, and
the curves that say more than a number drawn beside them (`benchmarks/probes/plots.py`).

The benchmarks grew their JSON one at a time, so each names its figures, targets and
verdicts its own way; `ADAPTERS` says, per benchmark, where each figure, its target and its
verdict are. A benchmark without an adapter still shows what its `targets` name; a run that
failed shows its error. A verdict the benchmark did not give is judged from the target's
text (`<= 1.5`, `>= 0.9`, `0`).

    .venv/bin/python -m benchmarks.report                # the table from existing results
    .venv/bin/python -m benchmarks.report --results DIR  # another directory of results
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

if __package__ in (None, ""):  # run as `python benchmarks/report.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.probes import plots

RESULTS: Final = Path(__file__).resolve().parent / "results"
COLUMNS: Final = ("benchmark", "figure", "target", "measured", "met", "load 1m start>end")


@dataclass(frozen=True)
class Figure:
    """Where one figure is in a benchmark's JSON (dotted paths). `target`: its text, or
    `@path` where the benchmark wrote it; `met`: the path of the benchmark's own verdict,
    None to judge the measured value against the target's text; a target of "" is a figure
    reported without one."""

    name: str
    measured: str
    target: str = ""
    met: str | None = None


F = Figure
ADAPTERS: Final[dict[str, tuple[Figure, ...]]] = {
    "api_fairness": (
        F(
            "team B write p99, flood / idle, with Pilotfish",
            "ratios.team_b_write_p99_flood_over_idle_with_pilotfish",
            "@targets.team_b_write_p99_flood_over_idle_with_pilotfish",
            "met",
        ),
        F(
            "team B write p99, flood / idle, FlowSchemas only",
            "ratios.team_b_write_p99_flood_over_idle_flowschemas_only",
        ),
        F(
            "team B write p99, flood / idle, without Pilotfish",
            "ratios.team_b_write_p99_flood_over_idle_without_pilotfish",
        ),
    ),
    "batch_job": (
        F("completion, BatchWorkload / Job", "ratios.completion_batchworkload_over_job", "<= 1.0"),
        F("batch operator writes per task", "ratios.batch_operator_writes_per_task", "<= 3.0"),
    ),
    "endpoint_freshness": (
        F("endpoint lag p99, Pilotfish / built-in", "lag_p99_ratio", "<= 1.0", "met.lag_p99_ratio"),
        F("slice writes per change", "writes_per_change", "<= 1.0", "met.writes_per_change"),
    ),
    "extender_handler": (F("handler p99 (ms)", "value", "@target", "met"),),
    "extender_overhead": (
        F(
            "bound/s with extender / without",
            "ratios.bound_per_second_with_over_without",
            "@targets.bound_per_second_with_over_without",
            "met",
        ),
    ),
    "gate_release": (
        F("release / raw patch rate", "ratios.release_over_raw", ">= 0.8", "met.release_ratio"),
        F(
            "burst condition -> ungated p99 (s)",
            "raw.release.burst_condition_to_ungated_p99_s",
            "<= 1.0",
            "met.condition_to_ungated_p99_burst",
        ),
        F(
            "single flip condition -> ungated p99 (s)",
            "raw.release.single_flip_condition_to_ungated_p99_s",
            "<= 1.0",
            "met.condition_to_ungated_p99_single_flip",
        ),
        F("paced / configured rate", "ratios.paced_over_configured", "1 +- 0.1", "met.paced_rate"),
    ),
    "maintenance": (
        F("drain, NodeMaintenance / kubectl", "ratio", "@targets.ratio", "met_by_figure.ratio"),
        F("budget violations", "violations", "0", "met_by_figure.violations"),
    ),
    "node_failure": (
        F(
            "lone node marked not ready (s)",
            "pilotfish.unreachable.by_s",
            "@targets.not_ready_s",
            "pilotfish.verdict.not_ready_within_2s_of_configured",
        ),
        F(
            "its replacements bound (s)",
            "pilotfish.replacements_bound.by_s",
            "@targets.replacements_bound_s",
            "pilotfish.verdict.replacements_bound_in_time",
        ),
        F("zone brake: evictions", "zone_brake.evictions", "0", "zone_brake.met"),
        F("zone brake: endpoints removed", "zone_brake.endpoints_removed", "0", "zone_brake.met"),
    ),
    "operator_memory": (
        F("operator RSS after pods (MB)", "summary.rss_after_mb", "<= 300", "summary.met.rss"),
        F(
            "watches per resource and selector",
            "summary.most_watches_per_resource_and_selector",
            "<= 1",
            "summary.met.one_watch_per_resource_and_selector",
        ),
        F(
            "kopf watches",
            "summary.kopf.resources",
            "NodeMaintenances only",
            "summary.met.kopf_watches_only_nodemaintenances",
        ),
    ),
    "prod_under_burst": (
        F(
            "production p99, BatchWorkload burst / idle",
            "ratios.production_p99_batchworkload_burst_over_idle",
            "<= 1.5",
        ),
        F("production p99, BatchWorkload burst (s)", "absolute_p99_s.batchworkload_burst", "< 5"),
        F("production p99, raw burst / idle", "ratios.production_p99_raw_burst_over_idle", ""),
    ),
    "reclaim": (
        F(
            "CPU used / capacity, reclaim on",
            "figures.used_over_capacity_on",
            "@targets.used_over_capacity_on",
            "checks.used_over_capacity_on",
        ),
        F(
            "spike -> batch figure reduced (cycles)",
            "figures.spike_to_reduced_cycles",
            "<= 1",
            "checks.spike_to_reduced_cycles",
        ),
        F(
            "spike -> first eviction (cycles)",
            "figures.spike_to_first_eviction_cycles",
            "<= 1",
            "checks.spike_to_first_eviction_cycles",
        ),
        F(
            "production evictions",
            "figures.production_evictions",
            "0",
            "checks.production_evictions",
        ),
    ),
    "rollout": (F("rollout time, ServiceWorkload / Deployment", "ratio", "<= 1.1", "met"),),
    "scale": (
        F("operator RSS at the end (MB)", "figures.operator_rss_end_mb", "<= 300", "met"),
        F("time to all bound (s)", "figures.all_bound_s"),
        F("production created -> bound p99 (s)", "figures.production_created_to_bound_p99_s"),
        F("extender filter p99 (s, bucket)", "figures.extender_filter_p99_le_s"),
        F("operator queue depth max", "figures.operator_queue_depth_max"),
        F("reconcile lag p99 (s)", "figures.reconcile_lag_p99_s"),
    ),
}


def get(obj: Any, path: str) -> Any:
    """The value at a dotted path, None where any step is missing."""
    for step in path.split("."):
        if not isinstance(obj, Mapping) or step not in obj:
            return None
        obj = obj[step]
    return obj


COMPARE: Final[dict[str, Callable[[float, float], bool]]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
    "==": operator.eq,
}


def judge(measured: Any, target: str) -> bool | None:
    """The measured value against a target's text; None when the text is no comparison or
    the value no number."""
    if isinstance(measured, bool) or not isinstance(measured, int | float):
        return None
    text = target.strip()
    for symbol in ("<=", ">=", "==", "<", ">"):
        if text.startswith(symbol):
            op, text = COMPARE[symbol], text[len(symbol) :].strip()
            break
    else:
        op = operator.eq
    try:
        bound = float(text)
    except ValueError:
        return None
    return op(float(measured), bound)


# Benchmarks that note the load per phase: (first phase's start, last phase's end).
LOADS: Final = {
    "batch_job": ("raw.job.load_average_1_5_15.start", "raw.batchworkload.load_average_1_5_15.end"),
    "prod_under_burst": (
        "phases.idle.load_average_start",
        "phases.batchworkload_burst.load_average_end",
    ),
}


def load_text(result: Mapping[str, Any], name: str = "") -> str:
    """The 1-minute load average at the run's start and end, whichever way it was written."""
    if name in LOADS:
        start, end = (get(result, path) for path in LOADS[name])
        result = {"load_average": {"start": start, "end": end}} if start or end else result
    la = result.get("load_average")
    start = get(result, "load_average.start") if isinstance(la, Mapping) else None
    end = get(result, "load_average.end") if isinstance(la, Mapping) else None
    start = start if start is not None else result.get("load_average_start")
    end = end if end is not None else result.get("load_average_end")
    if end is None and isinstance(la, list | tuple):
        end = la
    first = [f"{v[0]:.1f}" if isinstance(v, list | tuple) and v else "?" for v in (start, end)]
    return "" if start is None and end is None else ">".join(first)


def show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


Row = tuple[str, str, str, str, bool | None, str]


def rows_of(name: str, result: Mapping[str, Any], prefix: str = "") -> list[Row]:
    """One benchmark's rows: its adapter's figures, else what its `targets` name."""
    load = load_text(result, name)
    if "error" in result:
        return [(name, f"{prefix}error", "", str(result["error"])[:80], False, load)]
    if name == "scale" and "runs" in result:
        return sweep_rows(result)
    figures = ADAPTERS.get(name) or tuple(
        F(key, key, "@targets." + key) for key in (result.get("targets") or {})
    )
    out: list[Row] = []
    for f in figures:
        measured = get(result, f.measured)
        if measured is None and f.name == f.measured:  # no adapter: look where most put it
            for where in ("ratios", "figures", "summary"):
                measured = measured if measured is not None else get(result, f"{where}.{f.name}")
        target = show(get(result, f.target[1:])) if f.target.startswith("@") else f.target
        met = get(result, f.met) if f.met else None
        if not isinstance(met, bool):
            met = judge(measured, target) if target else None
        out.append((name, prefix + f.name, target, show(measured), met, load))
    return out


def sweep_rows(result: Mapping[str, Any]) -> list[Row]:
    out: list[Row] = []
    for run in result.get("runs") or []:
        nodes = get(run, "inputs.nodes")
        out += rows_of("scale", run, prefix=f"[{nodes} nodes] ")
    flagged = list(result.get("super_linear") or [])
    out.append(
        ("scale", "figures growing faster than nodes", "none", show(flagged), not flagged, "")
    )
    return out


def table(results: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    return [row for name in sorted(results) for row in rows_of(name, results[name])]


def render(rows: Sequence[Row]) -> str:
    """A plain text table, one row per figure."""
    cells = [
        [b, f, t, m, "-" if met is None else ("yes" if met else "NO"), la]
        for b, f, t, m, met, la in rows
    ]
    widths = [max(len(c[i]) for c in [list(COLUMNS), *cells]) for i in range(len(COLUMNS))]
    line = "  ".join("-" * w for w in widths)
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*COLUMNS), line, *(fmt.format(*c) for c in cells)])


def read(where: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every `<name>.json` in `where`; a file that is not one JSON object is noted."""
    out: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for path in sorted(where.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            problems.append(f"{path.name}: not one JSON object ({e})")
            continue
        if isinstance(data, dict):
            out[path.stem] = data
        else:
            problems.append(f"{path.name}: not a JSON object")
    return out, problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--results", type=Path, default=RESULTS, help="where the JSON objects are")
    p.add_argument("--no-plots", action="store_true", help="the table alone")
    args = p.parse_args(argv)
    results, problems = read(args.results)
    if not results and not problems:
        print(f"no results in {args.results}: run `make bench` first", file=sys.stderr)
        return 1
    drawn: list[Path] = []
    if not args.no_plots:
        if not plots.available():
            problems.append("matplotlib is not installed: no plots (pip install -e '.[dev]')")
        for name, result in sorted(results.items()):
            drawn += plots.write(name, result, args.results)
    print(render(table(results)))
    for path in drawn:
        print(f"plot: {path}")
    for problem in problems:
        print(f"note: {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
