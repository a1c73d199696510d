"""The image's two builds agree, and its cache key follows the wheel's inputs and nothing else.

The offline build (pilotfish.devcluster.image) and the Containerfile cannot both run here (no
registry for the Containerfile's base), so the Containerfile is read: it must install the
package list the offline build installs, make the same user and venv, and set the same
entrypoint, command and environment.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

import pilotfish
from pilotfish.devcluster import image, imagespec

ROOT = Path(__file__).resolve().parent.parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of the Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Containerfile").read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def only(kind: str) -> str:
    (found,) = [rest for word, rest in instructions() if word == kind]
    return found


def runs() -> list[str]:
    return [rest for word, rest in instructions() if word == "RUN"]


def test_package_list_is_read_with_comments_and_blank_lines_dropped(tmp_path: Path) -> None:
    (tmp_path / "devcluster" / "image").mkdir(parents=True)
    (tmp_path / "devcluster" / "image" / "packages.txt").write_text(
        "# header\n\npython3  # the interpreter\n  ca-certificates\n"
    )
    assert imagespec.read_packages(tmp_path) == ["python3", "ca-certificates"]
    assert {"python3", "python3-venv", "ca-certificates"} <= set(imagespec.read_packages(ROOT))


def test_containerfile_starts_from_the_same_debian_suite() -> None:
    assert only("FROM") == f"debian:{imagespec.SUITE}-slim"


def test_containerfile_installs_the_package_list_file_not_its_own_list() -> None:
    copies = [rest for word, rest in instructions() if word == "COPY"]
    assert "devcluster/image/packages.txt /tmp/packages.txt" in copies
    (install,) = [r for r in runs() if "apt-get install" in r]
    assert "$(sed -e 's/#.*//' /tmp/packages.txt)" in install
    # No package named beside the file: one source of truth.
    after = install.split("apt-get install", 1)[1].split("&&", 1)[0]
    named = [w for w in after.split() if not w.startswith("-") and "packages.txt" not in w]
    assert named == ["$(sed", "'s/#.*//'"]


def test_containerfile_makes_the_same_user_home_and_shell() -> None:
    (useradd,) = [r for r in runs() if "useradd" in r]
    words = shlex.split(useradd.split("useradd", 1)[1].split("&&", 1)[0])
    assert words[-1] == imagespec.USER
    words.remove("--create-home")
    opts = dict(zip(words[:-1:2], words[1:-1:2], strict=True))
    assert opts["--uid"] == opts["--gid"] == str(imagespec.UID)
    assert opts["--home-dir"] == imagespec.HOME
    assert opts["--shell"] == "/usr/sbin/nologin"
    assert f"groupadd --gid {imagespec.UID} {imagespec.USER}" in useradd
    assert f"chmod 0750 {imagespec.HOME}" in useradd


def test_containerfile_installs_the_wheel_inputs_into_the_same_venv() -> None:
    copied = set()
    for word, rest in instructions():
        if word == "COPY" and rest.split()[-1].startswith("/src"):
            copied.update(rest.split()[:-1])
    inputs = {p.relative_to(ROOT).parts[0] for p in imagespec.wheel_inputs(ROOT)}
    assert copied == inputs
    (venv,) = [r for r in runs() if "venv" in r]
    assert f"python3 -m venv {imagespec.VENV}" in venv
    assert f"{imagespec.VENV}/bin/pip install" in venv


def test_containerfile_runtime_config_is_the_offline_builds() -> None:
    config = imagespec.image_config()
    assert json.loads(only("ENTRYPOINT")) == config["Entrypoint"] == ["pilotfish"]
    assert json.loads(only("CMD")) == config["Cmd"]
    assert only("USER") == config["User"] == "65532:65532"
    assert only("WORKDIR") == config["WorkingDir"]
    assert shlex.split(only("ENV")) == config["Env"]


def test_entrypoint_is_the_console_script_on_the_venvs_path() -> None:
    (path,) = [e for e in imagespec.ENV if e.startswith("PATH=")]
    assert path.removeprefix("PATH=").split(":")[0] == f"{imagespec.VENV}/bin"
    scripts = imagespec.pyproject(ROOT)["project"]["scripts"]
    assert imagespec.ENTRYPOINT[0] in scripts


def test_wheel_inputs_cover_every_package_dir_and_skip_bytecode() -> None:
    inputs = imagespec.wheel_inputs(ROOT)
    rels = {p.relative_to(ROOT).as_posix() for p in inputs}
    assert {"pyproject.toml", "README.md", "pilotfish/devcluster/image.py"} <= rels
    assert "operators/__init__.py" in rels
    assert "scheduler-extender/__init__.py" in rels
    assert "admission-webhooks/__init__.py" in rels
    assert not [r for r in rels if "__pycache__" in r or r.endswith(".pyc")]


def fake_checkout(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["PyYAML>=6"]\n'
        '[tool.setuptools]\npackage-dir = { "x" = "pkg" }\n'
    )
    (root / "README.md").write_text("x\n")
    (root / "pkg" / "a.py").write_text("A = 1\n")
    return root


def test_cache_key_follows_sources_pins_and_base_only(tmp_path: Path) -> None:
    root = fake_checkout(tmp_path / "c")
    key = imagespec.app_key(root, "base1", ["pyyaml==6.0"])
    assert imagespec.app_key(root, "base1", ["pyyaml==6.0"]) == key
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert imagespec.app_key(root, "base1", ["pyyaml==6.0"]) == key  # bytecode is no input
    assert imagespec.app_key(root, "base2", ["pyyaml==6.0"]) != key
    assert imagespec.app_key(root, "base1", ["pyyaml==6.0.1"]) != key
    (root / "pkg" / "a.py").write_text("A = 2\n")
    changed = imagespec.app_key(root, "base1", ["pyyaml==6.0"])
    assert changed != key
    (root / "pkg" / "a.py").rename(root / "pkg" / "b.py")  # same bytes, another module
    assert imagespec.app_key(root, "base1", ["pyyaml==6.0"]) != changed


def test_base_key_follows_the_package_list() -> None:
    key = imagespec.base_key(["python3", "ca-certificates"])
    assert imagespec.base_key(["python3", "ca-certificates"]) == key
    assert imagespec.base_key(["python3", "ca-certificates", "curl"]) != key


def test_dependency_pins_are_the_installed_closure() -> None:
    pins = dict(p.split("==") for p in imagespec.dependency_pins(ROOT))
    for direct in ("kopf", "aiohttp", "pydantic", "cryptography", "kubernetes-asyncio"):
        assert pins[direct] == md.version(direct)
    # Transitive: aiohttp's multidict, pydantic's pydantic-core.
    assert pins["multidict"] == md.version("multidict")
    assert pins["pydantic-core"] == md.version("pydantic-core")
    # Test-only tools are not in the image.
    assert "pytest" not in pins
    assert "mypy" not in pins


def test_cached_archive_is_returned_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys: list[tuple[str, list[str]]] = []

    def key(root: Path, base: str, pins: list[str]) -> str:
        keys.append((base, pins))
        return "k1"

    monkeypatch.setattr(image, "app_key", key)
    cached = tmp_path / "image" / f"pilotfish-{pilotfish.__version__}-k1.oci.tar"
    cached.parent.mkdir()
    cached.write_bytes(b"an archive")
    monkeypatch.setattr(shutil, "which", lambda _t: pytest.fail("a warm build ran a tool"))
    assert image.build_image(tmp_path / "image") == cached
    # Keyed by the Debian layer's key and the checkout's pins, as built.
    assert keys == [
        (imagespec.base_key(imagespec.read_packages(ROOT)), imagespec.dependency_pins(ROOT))
    ]
    assert image.ref() == image.IMAGE_REF == f"pilotfish.local/pilotfish:{pilotfish.__version__}"


def test_only_the_newest_archives_are_kept(tmp_path: Path) -> None:
    for i in range(5):
        archive = tmp_path / f"pilotfish-0.1.0-{i}.oci.tar"
        archive.write_bytes(b"x")
        archive.with_suffix(".json").write_text("{}")
        os.utime(archive, (1000 + i, 1000 + i))
    (tmp_path / "kube-scheduler-v1-0.oci.tar").write_bytes(b"x")
    image._prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "kube-scheduler-v1-0.oci.tar",
        "pilotfish-0.1.0-3.oci.json",
        "pilotfish-0.1.0-3.oci.tar",
        "pilotfish-0.1.0-4.oci.json",
        "pilotfish-0.1.0-4.oci.tar",
    ]
