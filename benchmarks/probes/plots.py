"""Curves where a benchmark's number hides its shape: how pods bound over a scale run, how
long the operator lagged while it did, how its memory grew with the pods it holds; and, under
a burst, each production pod's wait in creation order. PNGs (matplotlib's Agg backend, no
display needed) beside the benchmark's JSON.

matplotlib is a development extra: without it `write` returns no paths and says why, and the
report's table is printed all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.probes.scale import RSS_TARGET_MB

try:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.axes import Axes
except ImportError:  # the table does not need it
    plt = None  # type: ignore[assignment]

Draw = Callable[["Axes", Sequence[tuple[str, Mapping[str, Any]]]], None]


def available() -> bool:
    return plt is not None


def scale_runs(result: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, series) of each finished size: one for a single run, one per size in a sweep."""
    runs = result.get("runs") if "runs" in result else [result]
    out: list[tuple[str, Mapping[str, Any]]] = []
    for run in runs or []:
        if isinstance(run, Mapping) and run.get("series"):
            out.append((f"{(run.get('inputs') or {}).get('nodes', '?')} nodes", run["series"]))
    return out


def _bound(ax: Axes, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    for label, s in runs:
        ax.plot(s["t_s"], s["bound"], label=f"bound, {label}")
        ax.plot(s["t_s"], s["created"], linestyle="--", label=f"created, {label}")
    ax.set(xlabel="seconds since submission", ylabel="pods", title="Pods created and bound")


def _lag(ax: Axes, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    for label, s in runs:
        lag = s.get("reconcile_lag") or []
        ax.plot([p[0] for p in lag], [p[1] for p in lag], marker=".", label=f"lag, {label}")
    ax.set(xlabel="seconds since submission", ylabel="reconcile lag (s)")
    ax.set_title("ServiceWorkload write -> observedGeneration; queue depth (right)")
    depth = ax.twinx()
    for label, s in runs:
        for controller, values in (s.get("queue_depth") or {}).items():
            if any(values):
                depth.plot(s["t_s"], values, linestyle=":", label=f"{controller}, {label}")
    depth.set_ylabel("keys queued")
    if depth.get_legend_handles_labels()[0]:
        depth.legend(loc="upper right", fontsize="small")


def _rss(ax: Axes, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    for label, s in runs:
        pairs = [(c, r) for c, r in zip(s["created"], s["operator_rss_mb"], strict=False) if r]
        ax.plot([c for c, _ in pairs], [r for _, r in pairs], marker=".", label=label)
    target = RSS_TARGET_MB
    ax.axhline(target, color="red", linestyle="--", label=f"target {target:g} MB")
    ax.set(xlabel="pods created", ylabel="operator RSS (MB)", title="Operator memory")


def _in_order(ax: Axes, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    for label, values in runs:
        ax.plot(range(len(values["v"])), values["v"], marker=".", label=label)
    ax.set(xlabel="production pod, in creation order", ylabel="created -> bound (s)")
    ax.set_title("Production placement under a burst")


def burst_runs(result: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    out: list[tuple[str, Mapping[str, Any]]] = []
    for phase, figures in (result.get("phases") or {}).items():
        values = ((figures or {}).get("production") or {}).get("created_to_bound_in_order_s")
        if values:
            out.append((phase, {"v": values}))
    return out


def _save(path: Path, draw: Draw, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> Path:
    assert plt is not None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        draw(ax, runs)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize="small")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
    return path


def write(name: str, result: Mapping[str, Any], where: Path) -> list[Path]:
    """The PNGs of one benchmark's result, as `<name>.<curve>.png` in `where`."""
    if plt is None:
        return []
    plans: list[tuple[str, Draw, list[tuple[str, Mapping[str, Any]]]]] = []
    if name == "scale" and (runs := scale_runs(result)):
        plans += [("bound", _bound, runs), ("lag", _lag, runs), ("rss", _rss, runs)]
    if name == "prod_under_burst" and (runs := burst_runs(result)):
        plans.append(("production", _in_order, runs))
    return [_save(where / f"{name}.{curve}.png", draw, runs) for curve, draw, runs in plans]
