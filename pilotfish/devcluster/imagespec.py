"""What goes into the Pilotfish image, and the keys its cached layers are found by.

Shared by the offline build (image.py) and the tests that hold the Containerfile to it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pilotfish
from pilotfish.devcluster.binaries import checkout_root

REPOSITORY = "pilotfish.local/pilotfish"
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# Documentation and translations nobody reads in a container (copyright files stay).
DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
# The chart's pods run as this user (podSecurityContext runAsUser/runAsGroup).
UID = 65532
USER = "pilotfish"
HOME = f"/home/{USER}"
VENV = "/opt/pilotfish"
ENTRYPOINT = ("pilotfish",)
ENV = (
    f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PYTHONUNBUFFERED=1",
    "PYTHONDONTWRITEBYTECODE=1",
)
# Timestamps in the layers and pycs (checked-hash pycs when SOURCE_DATE_EPOCH is set).
EPOCH = 0
# Bumped when the way the image is put together changes, to invalidate both caches.
FORMAT = "1"
# Directories the runtime mounts over, kept empty in the base layer.
EMPTY_DIRS = ("dev", "proc", "sys", "tmp", "run", "var/cache/apt/archives", "var/lib/apt/lists")


# The reference a node imports the archive under: the chart's image.repository, and its
# default tag (the chart's appVersion, which is the package's version).
IMAGE_REF = f"{REPOSITORY}:{pilotfish.__version__}"


def ref() -> str:
    return IMAGE_REF


def checkout() -> Path:
    root = checkout_root()
    if root is None:
        raise RuntimeError("the image is built from a source checkout (devcluster/ is missing)")
    return root


def cache_dir() -> Path:
    return Path(os.environ.get("PILOTFISH_CACHE", Path.home() / ".cache" / "pilotfish")) / "image"


def read_packages(root: Path | None = None) -> list[str]:
    """Debian packages of the image: devcluster/image/packages.txt, one a line, # comments."""
    path = (root or checkout()) / "devcluster" / "image" / "packages.txt"
    packages = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [p for p in packages if p]


def pyproject(root: Path) -> dict[str, Any]:
    with (root / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def wheel_inputs(root: Path | None = None) -> list[Path]:
    """Every file the wheel is built from: pyproject, README and the package directories."""
    root = root or checkout()
    dirs = sorted(set(pyproject(root)["tool"]["setuptools"]["package-dir"].values()))
    files = [root / "pyproject.toml", root / "README.md"]
    for d in dirs:
        for path in sorted((root / d).rglob("*")):
            rel = path.relative_to(root).parts
            if path.is_file() and "__pycache__" not in rel and path.suffix != ".pyc":
                files.append(path)
    return files


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def dependency_pins(root: Path | None = None) -> list[str]:
    """`name==version` of each installed distribution the wheel needs, transitively.

    From the environment running this build (the checkout's venv), so the image runs the
    versions the tests ran rather than whatever PyPI has newest today.
    """
    todo = [_requirement_name(r) for r in pyproject(root or checkout())["project"]["dependencies"]]
    pins: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in pins:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a dependency only under a marker this interpreter does not meet
        pins[name] = dist.version
        for req in dist.requires or []:
            if "extra ==" not in req and "extra==" not in req:
                todo.append(_requirement_name(req))
    return [f"{n}=={v}" for n, v in sorted(pins.items())]


def _digest(parts: Iterator[bytes]) -> str:
    sha = hashlib.sha256()
    for part in parts:
        sha.update(len(part).to_bytes(8, "big"))
        sha.update(part)
    return sha.hexdigest()[:16]


def base_key(packages: list[str]) -> str:
    """Key of the Debian layer: what mmdebstrap is asked for, and how the user is made."""
    fields = [FORMAT, SUITE, *MIRRORS, *DPKG_OPTIONS, *packages, str(UID), USER, HOME]
    fields += EMPTY_DIRS
    return _digest(f.encode() for f in fields)


def app_key(root: Path, base: str, pins: list[str]) -> str:
    """Key of the venv layer and of the archive: the wheel's inputs, pins, config, base."""

    def parts() -> Iterator[bytes]:
        yield from (FORMAT.encode(), base.encode(), ref().encode())
        yield json.dumps(image_config(), sort_keys=True).encode()
        yield from (p.encode() for p in pins)
        for path in wheel_inputs(root):
            yield path.relative_to(root).as_posix().encode()
            yield path.read_bytes()

    return _digest(parts())


def image_config() -> dict[str, Any]:
    """The runtime configuration: the chart's `command: [pilotfish]` finds the venv on PATH."""
    return {
        "User": f"{UID}:{UID}",
        "Entrypoint": list(ENTRYPOINT),
        "Cmd": ["--help"],
        "Env": list(ENV),
        "WorkingDir": HOME,
    }
