"""An image of the pinned kube-scheduler for the chart's second scheduler, built offline.

The chart runs upstream's registry.k8s.io/kube-scheduler, which a cluster without a registry
cannot pull. The binary `devcluster/build.sh` already built from the pinned module is static,
so the image is the Pilotfish image's Debian layer (shared on the node, no extra bytes) plus
one layer holding /usr/local/bin/kube-scheduler. Install the chart with
scheduler.image.repository=pilotfish.local/kube-scheduler (the tag is the pinned version,
the chart's default).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from pathlib import Path

from pilotfish.devcluster import image, ocilayout
from pilotfish.devcluster.binaries import bin_dir
from pilotfish.devcluster.imagespec import (
    EPOCH,
    UID,
    base_key,
    cache_dir,
    checkout,
    read_packages,
)

REPOSITORY = "pilotfish.local/kube-scheduler"
FORMAT = "1"


def kubernetes_version(root: Path | None = None) -> str:
    for line in ((root or checkout()) / "devcluster" / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("devcluster/versions.env pins no KUBERNETES_VERSION")


def ref() -> str:
    return f"{REPOSITORY}:{kubernetes_version()}"


def build_scheduler_image(
    cache: Path | None = None, binary: Path | None = None, progress: image.Progress | None = None
) -> Path:
    """Build (or find cached) the kube-scheduler image; return its OCI archive."""
    say = progress or (lambda _msg: None)
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    binary = binary or bin_dir() / "kube-scheduler"
    packages = read_packages()
    sha = hashlib.sha256(FORMAT.encode())
    sha.update(base_key(packages).encode())
    sha.update(ref().encode())
    with binary.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    archive = cache / f"kube-scheduler-{kubernetes_version()}-{sha.hexdigest()[:16]}.oci.tar"
    if archive.exists():
        return archive
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return archive
        _rootfs, base = image.base_layer(cache, packages, say)
        work = cache / f"work-scheduler-{sha.hexdigest()[:16]}"
        shutil.rmtree(work, ignore_errors=True)
        try:
            tree = work / "tree"
            (tree / "usr" / "local" / "bin").mkdir(parents=True)
            for d in (tree / "usr", tree / "usr" / "local", tree / "usr" / "local" / "bin"):
                d.chmod(0o755)
            shutil.copy2(binary, tree / "usr" / "local" / "bin" / "kube-scheduler")
            say("packing the kube-scheduler layer")
            layer = ocilayout.pack_layer(tree, work / "bin.tar.gz", prefix="", epoch=EPOCH)
            config = {
                "User": f"{UID}:{UID}",
                "Entrypoint": ["/usr/local/bin/kube-scheduler"],
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            }
            labels = {
                "org.opencontainers.image.title": "kube-scheduler",
                "org.opencontainers.image.version": kubernetes_version(),
            }
            ocilayout.write_layout(work / "layout", [base, layer], config, ref=ref(), labels=labels)
            ocilayout.write_archive(work / "layout", archive)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return archive
