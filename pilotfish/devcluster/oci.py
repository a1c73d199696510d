"""OCI image archives written here, offline: the real node's sandbox (pause) image and a small
busybox test image, since no registry is reachable from a local cluster.

An OCI archive is small enough to write by hand (one uncompressed tar layer, a config, a
manifest, an index), and writing it deterministically (fixed mtimes, sorted entries) makes
the archive's digest a function of its inputs, so it is cached like the Go binaries.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pilotfish.devcluster import ocilayout

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Local names: "pilotfish.local" is no registry anyone resolves, so a pod using one of these
# with imagePullPolicy IfNotPresent or Never runs the imported image and never pulls.
PAUSE_REF = "pilotfish.local/pause:1"
BUSYBOX_REF = "pilotfish.local/busybox:1"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static


@dataclass(frozen=True)
class Entry:
    """One file of a layer: a regular file (`data`), a symlink (`link`) or a directory."""

    path: str
    data: bytes | None = None
    link: str | None = None
    mode: int = 0o755


def cache_dir() -> Path:
    base = os.environ.get("PILOTFISH_CACHE") or str(Path.home() / ".cache" / "pilotfish")
    return Path(base) / "images"


def _layer(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(e.path.lstrip("/"))
            info.mtime = 0
            info.mode = e.mode
            if e.link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = e.link
                tar.addfile(info)
            elif e.data is not None:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
            else:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def archive(entries: list[Entry], config: dict[str, Any], ref: str) -> bytes:
    """The OCI archive of one single-layer linux/amd64 image named `ref`, written the way the
    Pilotfish image is (`ocilayout`: the layout, its index annotations, the archive)."""
    tar = _layer(entries)
    packed = gzip.compress(tar, mtime=0)
    with tempfile.TemporaryDirectory(prefix="pilotfish-oci-") as tmp:
        blob = Path(tmp) / "layer.tar.gz"
        blob.write_bytes(packed)
        layer = ocilayout.Layer(blob, _digest(packed), _digest(tar), len(packed))
        layout = Path(tmp) / "layout"
        ocilayout.write_layout(layout, [layer], config, ref=ref)
        return ocilayout.write_archive(layout, Path(tmp) / "image.tar").read_bytes()


def cached(name: str, entries: list[Entry], config: dict[str, Any], ref: str) -> Path:
    """Write the archive once per distinct content under the cache; its path."""
    data = archive(entries, config, ref)
    out = cache_dir() / f"{name}-{hashlib.sha256(data).hexdigest()[:12]}.tar"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(out)
    return out


def pause_image(pause_binary: Path) -> Path:
    """The sandbox image: the static `pause` program built with the kubelet."""
    entries = [Entry("/pause", data=pause_binary.read_bytes())]
    return cached("pause", entries, {"Entrypoint": ["/pause"], "Env": [PATH_ENV]}, PAUSE_REF)


def busybox_entries(busybox: Path = BUSYBOX) -> list[Entry]:
    """Debian's static busybox with a symlink per applet, a /tmp and the two usual users."""
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    entries = [
        Entry("/bin"),
        Entry("/bin/busybox", data=busybox.read_bytes()),
        Entry("/tmp", mode=0o1777),
        Entry("/etc", mode=0o755),
        Entry(
            "/etc/passwd",
            data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
            mode=0o644,
        ),
        Entry("/etc/group", data=b"root:x:0:\nnobody:x:65534:\n", mode=0o644),
    ]
    entries += [Entry(f"/bin/{a}", link="busybox") for a in applets if a != "busybox"]
    return entries


def busybox_image(busybox: Path = BUSYBOX) -> Path:
    """A small image for test pods: a shell, sleep, httpd and the rest of busybox."""
    config = {"Cmd": ["/bin/sh"], "Env": [PATH_ENV], "WorkingDir": "/"}
    return cached("busybox", busybox_entries(busybox), config, BUSYBOX_REF)
