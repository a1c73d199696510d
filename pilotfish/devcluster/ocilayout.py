"""An OCI image layout and its archive, written without a registry or a container engine.

The layers are tars made here rather than by a tool, so that their bytes depend only on the
files: entries sorted, modification times clamped to one epoch, owners numeric, gzip without a
name or a time. Two builds of the same tree give the same digests, which is what lets a node
that already holds the image skip the import.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
# containerd's importer names the image after this annotation (a full reference), where the
# OCI one carries only the tag that umoci and skopeo look up.
CONTAINERD_NAME = "io.containerd.image.name"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Layer:
    """A gzipped layer blob on disk: `digest` names the blob, `diff_id` its uncompressed tar."""

    path: Path
    digest: str
    diff_id: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "digest": self.digest, "diff_id": self.diff_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layer:
        path = Path(data["path"])
        return cls(path, data["digest"], data["diff_id"], path.stat().st_size)


class _HashingWriter(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `out`."""

    def __init__(self, out: io.BufferedIOBase | None) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.sha.update(data)
        self.size += len(data)
        if self.out is not None:
            self.out.write(data)
        return len(data)


def _walk(root: Path, skip: frozenset[str], rel: str = "") -> Iterator[tuple[Path, str]]:
    """Every path under root with its name relative to root, sorted, parents first."""
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        name = f"{rel}/{entry.name}" if rel else entry.name
        yield Path(entry.path), name
        if entry.is_dir(follow_symlinks=False) and name not in skip:
            yield from _walk(Path(entry.path), skip, name)


def pack_layer(
    tree: Path,
    out: Path,
    *,
    prefix: str,
    epoch: int = 0,
    skip_contents: Iterable[str] = (),
) -> Layer:
    """Tar `tree` as `prefix/...` into the gzipped blob `out`.

    `skip_contents` names directories (relative to the archive root, e.g. "dev") kept empty:
    the runtime mounts its own /dev, /proc and /sys, and device nodes have no place in an image.
    """
    skip = frozenset(skip_contents)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with tmp.open("wb") as raw:
        compressed = _HashingWriter(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0) as gz:
            plain = _HashingWriter(gz)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                if prefix:
                    _add(tar, tree, prefix, epoch)
                for path, name in _walk(tree, skip):
                    _add(tar, path, f"{prefix}/{name}" if prefix else name, epoch)
    tmp.rename(out)
    return Layer(
        out,
        "sha256:" + compressed.sha.hexdigest(),
        "sha256:" + plain.sha.hexdigest(),
        compressed.size,
    )


def _add(tar: tarfile.TarFile, path: Path, arcname: str, epoch: int) -> None:
    if path.is_char_device() or path.is_block_device() or path.is_fifo() or path.is_socket():
        return
    info = tar.gettarinfo(str(path), arcname)
    info.mtime = min(int(info.mtime), epoch)
    info.uname = info.gname = ""
    info.pax_headers = {}
    if info.isreg():
        with path.open("rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def _blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_layout(
    layout: Path,
    layers: list[Layer],
    config: dict[str, Any],
    *,
    ref: str,
    labels: dict[str, str] | None = None,
) -> str:
    """Write an OCI image layout holding one image named `ref`; return the manifest digest.

    `config` is the runtime part of the image configuration (Entrypoint, User, Env...).
    """
    if layout.exists():
        shutil.rmtree(layout)
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    for layer in layers:
        target = layout / "blobs" / "sha256" / layer.digest.removeprefix("sha256:")
        try:
            os.link(layer.path, target)
        except OSError:
            shutil.copyfile(layer.path, target)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {**config, "Labels": dict(labels or {})},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
    }
    config_desc = _blob(layout, _canonical(image_config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, **config_desc},
        "layers": [
            {"mediaType": MEDIA_LAYER, "digest": layer.digest, "size": layer.size}
            for layer in layers
        ],
        "annotations": dict(labels or {}),
    }
    manifest_desc = _blob(layout, _canonical(manifest))
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                **manifest_desc,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {REF_NAME: tag, CONTAINERD_NAME: ref},
            }
        ],
    }
    (layout / "index.json").write_bytes(_canonical(index))
    digest: str = manifest_desc["digest"]
    return digest


def write_archive(layout: Path, archive: Path) -> Path:
    """The layout as one uncompressed tar (an "oci-archive"): the layers are gzipped already."""
    tmp = archive.with_name(archive.name + ".part")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, rel in _walk(layout, frozenset()):
            info = tar.gettarinfo(str(path), rel)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    tmp.rename(archive)
    return archive


def read_index(layout: Path) -> dict[str, Any]:
    """The manifest and config of the layout's only image, parsed (for checks and reports)."""
    index = json.loads((layout / "index.json").read_text())
    (desc,) = index["manifests"]
    manifest = json.loads(_read_blob(layout, desc["digest"]))
    config = json.loads(_read_blob(layout, manifest["config"]["digest"]))
    return {"index": index, "manifest": manifest, "config": config}


def _read_blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()
