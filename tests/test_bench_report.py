"""benchmarks/report.py: the one table from every benchmark's JSON (each shaped its own way),
and the plots drawn beside them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from benchmarks import api_fairness, report
from benchmarks.probes import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

BATCH_JOB = {
    "benchmark": "batch_job",
    "raw": {
        "job": {"load_average_1_5_15": {"start": [0.5, 0.4, 0.3], "end": [1.0, 0.5, 0.3]}},
        "batchworkload": {"load_average_1_5_15": {"start": [1.0, 1, 1], "end": [4.2, 1, 1]}},
    },
    "ratios": {"completion_batchworkload_over_job": 1.2, "batch_operator_writes_per_task": 2.0},
    "targets": {"completion_batchworkload_over_job": "<= 1.0"},
    "met": False,
}
GATE_RELEASE = {
    "benchmark": "gate_release",
    "raw": {"release": {"burst_condition_to_ungated_p99_s": 0.5}},
    "ratios": {"release_over_raw": 0.85, "paced_over_configured": 1.5},
    # The benchmark's own verdicts win over the target's text (paced: 1 +- 0.1 is no
    # comparison the report could judge).
    "met": {"release_ratio": False, "paced_rate": False, "condition_to_ungated_p99_burst": True},
}
OPERATOR_MEMORY = {
    "benchmark": "operator_memory",
    "summary": {
        "rss_after_mb": 250.0,
        "most_watches_per_resource_and_selector": 1,
        "kopf": {"resources": []},
        "met": {"rss": True, "one_watch_per_resource_and_selector": True},
    },
    "load_average_start": [3.0, 2, 1],
    "load_average_end": [5.5, 2, 1],
}


def scale_run(nodes: int, rss: float | None, points: int = 5) -> dict[str, Any]:
    t = [float(i * 2) for i in range(points)]
    return {
        "benchmark": "scale",
        "inputs": {"nodes": nodes},
        "figures": {"operator_rss_end_mb": rss, "all_bound_s": 60.0, "reconcile_lag_p99_s": 0.4},
        "series": {
            "t_s": t,
            "created": [i * 10 for i in range(points)],
            "bound": [i * 9 for i in range(points)],
            "operator_rss_mb": [100.0 + i for i in range(points)],
            "queue_depth": {"gates": [0, 1, 3, 1, 0][:points]},
            "reconcile_lag": [[x, 0.1 * i] for i, x in enumerate(t)],
        },
        "met": rss is not None and rss <= 300,
        "load_average": {"start": [1.25, 1, 1], "end": [2.0, 1, 1]},
    }


def rows_by_figure(name: str, result: dict[str, Any]) -> dict[str, report.Row]:
    return {r[1]: r for r in report.rows_of(name, result)}


def test_a_figure_is_judged_against_its_target_when_the_benchmark_gave_no_verdict() -> None:
    rows = rows_by_figure("batch_job", BATCH_JOB)
    completion = rows["completion, BatchWorkload / Job"]
    assert completion[2:5] == ("<= 1.0", "1.2", False)
    assert rows["batch operator writes per task"][4] is True
    assert completion[5] == "0.5>4.2"  # the first phase's start, the last phase's end


def test_the_benchmarks_own_verdict_wins_over_the_targets_text() -> None:
    rows = rows_by_figure("gate_release", GATE_RELEASE)
    assert rows["release / raw patch rate"][4] is False  # 0.85 >= 0.8, but the benchmark said no
    assert rows["paced / configured rate"][4] is False
    assert rows["burst condition -> ungated p99 (s)"][3:5] == ("0.5", True)
    missing = rows["single flip condition -> ungated p99 (s)"]
    assert missing[3:5] == ("-", None)  # not measured: neither met nor failed


def test_nested_summaries_and_split_load_averages_are_read() -> None:
    rows = rows_by_figure("operator_memory", OPERATOR_MEMORY)
    assert rows["operator RSS after pods (MB)"][2:6] == ("<= 300", "250", True, "3.0>5.5")
    assert rows["kopf watches"][3] == "none"


def test_a_failed_run_is_one_failing_row_with_its_error() -> None:
    rows = report.rows_of("rollout", {"benchmark": "rollout", "error": "TimeoutError: slow"})
    assert rows == [("rollout", "error", "", "TimeoutError: slow", False, "")]


def test_a_benchmark_without_an_adapter_shows_what_its_targets_name() -> None:
    result = {"targets": {"speedup": ">= 2", "p99_s": "< 1"}, "ratios": {"speedup": 1.5}}
    result["figures"] = {"p99_s": 0.2}
    rows = rows_by_figure("new_bench", result)
    assert rows["speedup"][2:5] == (">= 2", "1.5", False)
    assert rows["p99_s"][2:5] == ("< 1", "0.2", True)


@pytest.mark.parametrize(
    ("measured", "target", "met"),
    [
        (1.0, "<= 1.0", True),
        (1.01, "<= 1.0", False),
        (0.9, ">= 0.9", True),
        (5.0, "< 5", False),
        (0, "0", True),
        (2, "0", False),
        (1.0, "1 +- 0.1", None),
        ("fast", "<= 1", None),
        (True, "<= 1", None),
    ],
)
def test_judge_reads_the_targets_comparison(measured: Any, target: str, met: bool | None) -> None:
    assert report.judge(measured, target) is met


def test_a_sweep_has_rows_per_size_and_one_for_super_linear_growth() -> None:
    sweep = {
        "benchmark": "scale",
        "runs": [scale_run(250, 120.0), scale_run(500, 320.0)],
        "super_linear": ["operator_rss_end_mb"],
    }
    rows = rows_by_figure("scale", sweep)
    assert rows["[250 nodes] operator RSS at the end (MB)"][4] is True
    assert rows["[500 nodes] operator RSS at the end (MB)"][4] is False
    growth = rows["figures growing faster than nodes"]
    assert growth[3:5] == ("operator_rss_end_mb", False)
    clean = rows_by_figure("scale", sweep | {"super_linear": []})
    assert clean["figures growing faster than nodes"][3:5] == ("none", True)


def test_the_table_has_a_header_and_one_aligned_line_per_figure() -> None:
    rows = report.table({"batch_job": BATCH_JOB, "scale": scale_run(30, 130.0)})
    text = report.render(rows).splitlines()
    assert text[0].split()[:3] == ["benchmark", "figure", "target"]
    assert len(text) == 2 + len(rows)
    assert {len(line) for line in text} == {len(text[1])}
    met_at = text[0].index("met ")
    assert {line[met_at : met_at + 3].strip() for line in text[2:]} <= {"yes", "NO", "-"}
    assert any(line.startswith("scale") and "yes" in line for line in text)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.skipif(not plots.available(), reason="matplotlib is a dev extra")
def test_scale_curves_are_written_as_pngs_for_a_run_and_a_sweep(tmp_path: Path) -> None:
    written = plots.write("scale", scale_run(30, 130.0), tmp_path)
    assert sorted(p.name for p in written) == ["scale.bound.png", "scale.lag.png", "scale.rss.png"]
    for path in written:
        width, height = png_size(path)
        assert width > 100 and height > 100
    sweep = {"runs": [scale_run(20, 100.0), scale_run(40, 110.0, points=3)]}
    assert len(plots.write("scale", sweep, tmp_path / "")) == 3


@pytest.mark.skipif(not plots.available(), reason="matplotlib is a dev extra")
def test_a_burst_plots_production_waits_and_a_benchmark_without_curves_none(
    tmp_path: Path,
) -> None:
    burst = {"phases": {"idle": {"production": {"created_to_bound_in_order_s": [0.1, 0.2]}}}}
    (path,) = plots.write("prod_under_burst", burst, tmp_path)
    png_size(path)
    assert plots.write("batch_job", BATCH_JOB, tmp_path) == []
    assert plots.write("scale", {"benchmark": "scale", "error": "x"}, tmp_path) == []


def test_main_prints_the_table_from_existing_results_and_notes_a_broken_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "batch_job.json").write_text(json.dumps(BATCH_JOB))
    (tmp_path / "scale.json").write_text(json.dumps(scale_run(30, 130.0)))
    (tmp_path / "rollout.json").write_text("{not json")
    assert report.main(["--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "completion, BatchWorkload / Job" in out
    assert "operator RSS at the end (MB)" in out
    assert "note: rollout.json: not one JSON object" in out
    if plots.available():
        assert (tmp_path / "scale.rss.png").exists()


def test_main_without_results_says_how_to_make_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report.main(["--results", str(tmp_path)]) == 1
    assert "make bench" in capsys.readouterr().err


def test_api_fairness_figures_are_read_from_the_keys_the_benchmark_writes() -> None:
    raw = {
        "with_pilotfish": {"ratio": 1.2},
        "flowschemas_only": {"ratio": 4.0},
        "without_pilotfish": {"ratio": 40.0},
    }
    result = {"benchmark": "api_fairness", "raw": raw} | api_fairness.figures(raw)
    rows = rows_by_figure("api_fairness", result)
    assert [(r[2], r[3], r[4]) for r in rows.values()] == [
        ("<= 1.5", "1.2", True),
        ("", "4", None),
        ("", "40", None),
    ]
