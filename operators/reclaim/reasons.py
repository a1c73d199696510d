"""The names the reclaim controller writes: its condition's reasons, its Events, and its
eviction results (API: `kubectl describe node`, dashboards and alerts match on them)."""

from __future__ import annotations

from typing import Final

# BatchCapacity condition reasons (and the annotation's `state`).
MEASURED: Final = "Measured"  # True: the figure is from fresh usage data
METRICS_STALE: Final = "MetricsStale"  # False: the node's usage data is too old or missing
PROMETHEUS_UNAVAILABLE: Final = "PrometheusUnavailable"  # False: the queries failed
DECAYING: Final = frozenset({METRICS_STALE, PROMETHEUS_UNAVAILABLE})

# Events: on the node when its figure stops (or starts again) being measured; on each batch
# pod evicted to give capacity back.
EVENT_STALE: Final = "ReclaimStale"
EVENT_RECOVERED: Final = "ReclaimRecovered"
EVENT_EVICTED: Final = "BatchEvicted"
ACTION_MEASURE: Final = "MeasureBatchCapacity"
ACTION_EVICT: Final = "Evict"

# pilotfish_reclaim_evictions_total{result}
EVICTED: Final = "evicted"
REFUSED: Final = "refused"  # 429: a disruption budget says not now; tried next cycle
GONE: Final = "gone"  # gone already, or replaced by a pod of the same name
ERROR: Final = "error"
