"""Where the upstream binaries are: PILOTFISH_BIN_DIR, else the checkout's build cache.

The binaries are built from the pinned Go modules by `devcluster/build.sh` into a cache
outside the checkout; this module only finds them and says clearly what is missing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pilotfish

REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    # The usage store the reclaim controller queries, and its rule checker.
    "prometheus",
    "promtool",
)


class MissingBinaries(RuntimeError):
    pass


def checkout_root() -> Path | None:
    """The source checkout this package runs from, if it is an editable install."""
    root = Path(pilotfish.__file__).resolve().parent.parent
    return root if (root / "devcluster" / "build.sh").exists() else None


def bin_dir(build: bool = False) -> Path:
    """The directory holding every required binary; build them first when `build` is true."""
    env = os.environ.get("PILOTFISH_BIN_DIR")
    if env:
        found = Path(env)
    else:
        root = checkout_root()
        if root is None:
            raise MissingBinaries(
                "set PILOTFISH_BIN_DIR to a directory with " + ", ".join(REQUIRED)
            )
        script = root / "devcluster" / "build.sh"
        args = [str(script)] if build else [str(script), "--print"]
        res = subprocess.run(args, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise MissingBinaries(
                f"the control-plane binaries are not built; run `{script}` (or `make binaries`)"
                + (f":\n{res.stderr[-2000:]}" if build else "")
            )
        found = Path(res.stdout.strip().splitlines()[-1])
    missing = [b for b in REQUIRED if not os.access(found / b, os.X_OK)]
    if missing:
        raise MissingBinaries(
            f"{found}: missing {', '.join(missing)}; "
            + (
                f"run `{root / 'devcluster' / 'build.sh'}` (or `make binaries`)"
                if (root := checkout_root()) is not None
                else "build them from the checkout's devcluster/ (`make binaries`)"
            )
        )
    return found


def kwok_stage_dir(bins: Path) -> Path:
    """The kwok stage documents shipped beside the binaries by the build."""
    env = os.environ.get("PILOTFISH_KWOK_STAGES")
    return Path(env) if env else bins.parent / "kwok-stage"


def kwok_crd_dir(bins: Path) -> Path:
    """kwok's CRDs (Metric, ClusterResourceUsage, ...), shipped beside the binaries."""
    return bins.parent / "kwok-crd"


def kwok_metrics_dir(bins: Path) -> Path:
    """kwok's kubelet-style metrics and usage documents, shipped beside the binaries."""
    return bins.parent / "kwok-metrics"


def helm(bins: Path) -> Path:
    path = bins / "helm"
    if not os.access(path, os.X_OK):
        raise MissingBinaries(f"{path}: helm is missing")
    return path
