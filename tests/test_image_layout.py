"""The OCI layout writer: layers that depend only on the files, a layout umoci accepts."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from pilotfish.devcluster import ocilayout


def tree(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "b.conf").write_text("b\n")
    (root / "etc" / "a.conf").write_text("a\n")
    os.link(root / "etc" / "a.conf", root / "etc" / "a-again.conf")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "bin" / "alias").symlink_to("tool")
    (root / "dev").mkdir()
    (root / "dev" / "leftover").write_text("kept out\n")
    return root


def members(layer: ocilayout.Layer) -> list[tarfile.TarInfo]:
    with tarfile.open(layer.path, "r:gz") as tar:
        return tar.getmembers()


def test_layer_is_sorted_clamped_and_digested(tmp_path: Path) -> None:
    root = tree(tmp_path / "root")
    layer = ocilayout.pack_layer(root, tmp_path / "l.tar.gz", prefix="", skip_contents=["dev"])
    got = members(layer)
    assert [m.name for m in got] == [
        "bin",
        "bin/alias",
        "bin/tool",
        "dev",
        "etc",
        "etc/a-again.conf",
        "etc/a.conf",
        "etc/b.conf",
    ]
    by_name = {m.name: m for m in got}
    assert by_name["bin/alias"].issym() and by_name["bin/alias"].linkname == "tool"
    assert by_name["bin/tool"].mode & 0o777 == 0o755
    # The second name of a hard-linked file is a link to the first, not a second copy.
    assert by_name["etc/a.conf"].islnk() and by_name["etc/a.conf"].linkname == "etc/a-again.conf"
    assert {m.mtime for m in got} == {0}
    assert {m.uname for m in got} == {""}
    blob = layer.path.read_bytes()
    assert layer.digest == "sha256:" + hashlib.sha256(blob).hexdigest()
    assert layer.diff_id == "sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest()
    assert layer.size == len(blob)


def test_layer_digest_depends_on_content_not_on_times(tmp_path: Path) -> None:
    root = tree(tmp_path / "root")
    first = ocilayout.pack_layer(root, tmp_path / "1.tar.gz", prefix="opt/x")
    os.utime(root / "etc" / "b.conf", (1_700_000_000, 1_700_000_000))
    second = ocilayout.pack_layer(root, tmp_path / "2.tar.gz", prefix="opt/x")
    assert (first.digest, first.diff_id) == (second.digest, second.diff_id)
    assert members(first)[0].name == "opt/x"
    (root / "etc" / "b.conf").write_text("changed\n")
    third = ocilayout.pack_layer(root, tmp_path / "3.tar.gz", prefix="opt/x")
    assert third.digest != first.digest


def layout_of(tmp_path: Path) -> tuple[Path, str]:
    root = tree(tmp_path / "root")
    layer = ocilayout.pack_layer(root, tmp_path / "l.tar.gz", prefix="", skip_contents=["dev"])
    layout = tmp_path / "layout"
    config = {"User": "65532:65532", "Entrypoint": ["/bin/tool"], "Env": ["PATH=/bin"]}
    digest = ocilayout.write_layout(
        layout, [layer], config, ref="pilotfish.local/x:1.2", labels={"k": "v"}
    )
    return layout, digest


def test_layout_names_the_image_for_umoci_and_containerd(tmp_path: Path) -> None:
    layout, digest = layout_of(tmp_path)
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    parsed = ocilayout.read_index(layout)
    (desc,) = parsed["index"]["manifests"]
    assert desc["digest"] == digest
    assert desc["annotations"] == {
        "org.opencontainers.image.ref.name": "1.2",
        "io.containerd.image.name": "pilotfish.local/x:1.2",
    }
    for blob in [parsed["manifest"]["config"], *parsed["manifest"]["layers"]]:
        data = (layout / "blobs" / "sha256" / blob["digest"].split(":")[1]).read_bytes()
        assert len(data) == blob["size"]
        assert "sha256:" + hashlib.sha256(data).hexdigest() == blob["digest"]
    config = parsed["config"]
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Labels"] == {"k": "v"}
    assert config["rootfs"]["diff_ids"][0].startswith("sha256:")


def test_archive_is_the_layout_as_a_tar(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path)
    archive = ocilayout.write_archive(layout, tmp_path / "x.oci.tar")
    again = ocilayout.write_archive(layout, tmp_path / "y.oci.tar")
    assert archive.read_bytes() == again.read_bytes()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        index = tar.extractfile("index.json")
        assert index is not None
        assert json.load(io.TextIOWrapper(index)) == json.loads((layout / "index.json").read_text())
    assert "oci-layout" in names
    assert names == sorted(names, key=lambda n: n.split("/"))


@pytest.mark.skipif(shutil.which("umoci") is None, reason="umoci is not installed")
def test_umoci_reads_and_unpacks_the_layout(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path)
    subprocess.run(
        ["umoci", "stat", "--json", "--image", f"{layout}:1.2"],
        capture_output=True,
        text=True,
        check=True,
    )
    if os.geteuid() != 0:
        return
    bundle = tmp_path / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{layout}:1.2", str(bundle)],
        capture_output=True,
        check=True,
    )
    rootfs = bundle / "rootfs"
    assert (rootfs / "etc" / "a.conf").read_text() == "a\n"
    assert os.readlink(rootfs / "bin" / "alias") == "tool"
    assert not (rootfs / "dev" / "leftover").exists()
    runtime = json.loads((bundle / "config.json").read_text())
    assert runtime["process"]["user"]["uid"] == 65532
    assert runtime["process"]["args"] == ["/bin/tool"]
