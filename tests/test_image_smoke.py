"""The built image runs: unpacked by umoci, started by runc as the chart starts it (user
65532, read-only root), its `pilotfish` accepts each Deployment's arguments.

Builds the image (a few minutes cold, instant when cached), so it runs only when asked:
PILOTFISH_IMAGE_TESTS=1, as root, with network to Debian's mirror and PyPI for a cold build.
    PILOTFISH_IMAGE_TESTS=1 .venv/bin/python -m pytest tests/test_image_smoke.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from pilotfish.devcluster import image, imagespec, ocilayout, schedulerimage
from pilotfish.devcluster.binaries import MissingBinaries
from tests.test_chart_tls import container
from tests.test_chart_values import needs_helm, render
from tests.test_image_chart import LOCAL_IMAGE, PILOTFISH, pod_args

pytestmark = pytest.mark.skipif(
    os.environ.get("PILOTFISH_IMAGE_TESTS") != "1" or os.geteuid() != 0,
    reason="builds the image: set PILOTFISH_IMAGE_TESTS=1 and run as root",
)


def unpack(archive: Path, tmp: Path, ref: str) -> Path:
    """The runtime bundle of the archive's image, checking it is named `ref` for containerd."""
    with tarfile.open(archive) as tar:
        tar.extractall(tmp / "layout", filter="tar")
    parsed = ocilayout.read_index(tmp / "layout")
    (desc,) = parsed["index"]["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == ref
    tag = desc["annotations"]["org.opencontainers.image.ref.name"]
    assert tag == ref.rsplit(":", 1)[1]
    subprocess.run(
        ["umoci", "unpack", "--image", f"{tmp / 'layout'}:{tag}", str(tmp / "bundle")],
        check=True,
        capture_output=True,
    )
    return tmp / "bundle"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Pilotfish image's runtime bundle, unpacked from the archive a node imports."""
    image.ensure_tools("umoci", "runc")
    return unpack(image.build_image(), tmp_path_factory.mktemp("image"), image.ref())


def run(bundle: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run argv in a container of the bundle: the image's user and env, root read-only."""
    path = bundle / "config.json"
    config: dict[str, Any] = json.loads(path.read_text())
    config["process"]["args"] = args
    config["process"]["terminal"] = False
    config["root"]["readonly"] = True
    path.write_text(json.dumps(config))
    name = f"pilotfish-smoke-{uuid.uuid4().hex[:8]}"
    try:
        return subprocess.run(
            ["runc", "run", "--bundle", str(bundle), name],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    finally:
        subprocess.run(["runc", "delete", "--force", name], capture_output=True, check=False)


def test_image_runs_pilotfish_as_the_non_root_user(bundle: Path) -> None:
    config = json.loads((bundle / "config.json").read_text())
    assert config["process"]["user"]["uid"] == imagespec.UID
    assert config["process"]["args"] == ["pilotfish", "--help"]
    helped = run(bundle, ["pilotfish", "--help"])
    assert helped.returncode == 0, helped.stderr
    for verb in ("operator", "extender", "webhooks"):
        assert verb in helped.stdout
    probe = run(
        bundle,
        [
            "python",
            "-c",
            "import os, sys, pilotfish.operators, pilotfish.extender.server, "
            "pilotfish.webhooks.server, kopf; print(os.getuid(), os.getgid(), sys.prefix, "
            "sys.version_info[:2])",
        ],
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split()[:3] == [str(imagespec.UID), str(imagespec.UID), imagespec.VENV]


@needs_helm
def test_image_accepts_each_deployments_command_line(bundle: Path) -> None:
    docs = render(*LOCAL_IMAGE)
    for name in PILOTFISH:
        c = container(docs, name)
        code = (
            "import sys; from pilotfish.cli.main import parser; "
            "print(parser().parse_args(sys.argv[1:]).cmd)"
        )
        parsed = run(bundle, ["python", "-c", code, *pod_args(c)])
        assert parsed.returncode == 0, (name, parsed.stderr)
        assert parsed.stdout.strip() == name.removeprefix("pilotfish-")


def test_scheduler_image_runs_the_pinned_kube_scheduler(tmp_path: Path) -> None:
    image.ensure_tools("umoci", "runc")
    try:
        archive = schedulerimage.build_scheduler_image()
    except MissingBinaries as e:
        pytest.skip(str(e))
    ref = schedulerimage.ref()
    assert ref == f"pilotfish.local/kube-scheduler:{schedulerimage.kubernetes_version()}"
    sched = unpack(archive, tmp_path, ref)
    version = run(sched, ["kube-scheduler", "--version"])
    assert version.returncode == 0, version.stderr
    assert version.stdout.split() == ["Kubernetes", schedulerimage.kubernetes_version()]
    config = json.loads((sched / "config.json").read_text())
    assert config["process"]["user"]["uid"] == imagespec.UID
