"""The Pilotfish image, built on this machine from Debian's packages and the checkout's wheel.

No registry is needed: the root filesystem comes from a Debian mirror (mmdebstrap), the wheel
from the checkout, its dependencies from PyPI at the versions the checkout's environment runs
(so the image runs the code the tests ran), and the OCI layout is written by ocilayout. The
`Containerfile` at the repository root builds the same image with Docker or Buildah; both read
the package list from devcluster/image/packages.txt.

Two layers, each cached under $PILOTFISH_CACHE/image: Debian's (keyed by the package list,
the suite and mirrors) and the venv at /opt/pilotfish (keyed by the wheel's inputs and the
dependency pins). A build with nothing changed returns the cached archive at once; a code
change rebuilds only the venv layer.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pilotfish
from pilotfish.devcluster import ocilayout
from pilotfish.devcluster.imagespec import (
    DPKG_OPTIONS,
    EMPTY_DIRS,
    ENV,
    EPOCH,
    HOME,
    IMAGE_REF,
    MIRRORS,
    SUITE,
    UID,
    USER,
    VENV,
    app_key,
    base_key,
    cache_dir,
    checkout,
    dependency_pins,
    image_config,
    read_packages,
    ref,
    wheel_inputs,
)

__all__ = ["IMAGE_REF", "base_layer", "build_image", "cli", "ensure_tools", "ref", "versions"]

# Archives kept in the cache (one per source state built), newest first.
KEEP_ARCHIVES = 3

Progress = Callable[[str], None]


def ensure_tools(*tools: str) -> None:
    """Install the Debian packages named like the missing tools (mmdebstrap, umoci, runc)."""
    missing = [t for t in tools if shutil.which(t) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"{', '.join(missing)} missing: apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    if (
        subprocess.run(
            [*apt, "install", "-y", "--no-install-recommends", *missing],
            env=env,
            check=False,
            capture_output=True,
        ).returncode
        != 0
    ):
        _run([*apt, "update"], env=env)
        _run([*apt, "install", "-y", "--no-install-recommends", *missing], env=env)


def _run(cmd: list[str], **kwargs: Any) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if res.returncode != 0:
        raise RuntimeError(
            f"{cmd[0]} exited {res.returncode}:\n{(res.stderr or res.stdout)[-3000:]}"
        )
    out: str = res.stdout
    return out


def _build_base(packages: list[str], into: Path, progress: Progress) -> ocilayout.Layer:
    """Debian's root filesystem with the image's user, packed as the first layer."""
    ensure_tools("mmdebstrap")
    rootfs = into / "rootfs"
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    progress(f"mmdebstrap {SUITE}: {' '.join(packages)}")
    _run(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            # A merged /usr without the usrmerge package (and the perl it pulls in).
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            *(f"--dpkgopt={o}" for o in DPKG_OPTIONS),
            SUITE,
            str(rootfs),
            *MIRRORS,
        ],
        env={**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH)},
    )
    etc = rootfs / "etc"
    with (etc / "passwd").open("a") as f:
        f.write(f"{USER}:x:{UID}:{UID}:Pilotfish:{HOME}:/usr/sbin/nologin\n")
    with (etc / "group").open("a") as f:
        f.write(f"{USER}:x:{UID}:\n")
    with (etc / "shadow").open("a") as f:
        f.write(f"{USER}:!:1::::::\n")
    (rootfs / HOME.lstrip("/")).mkdir(mode=0o750)
    os.chown(rootfs / HOME.lstrip("/"), UID, UID)
    # The build host's resolver and name: the runtime mounts the pod's own over them.
    for name in ("resolv.conf", "hostname"):
        (etc / name).write_text("")
        (etc / name).chmod(0o644)
    progress("packing the Debian layer")
    layer = ocilayout.pack_layer(
        rootfs, into / "layer.tar.gz", prefix="", epoch=EPOCH, skip_contents=EMPTY_DIRS
    )
    (into / "layer.json").write_text(json.dumps(layer.to_json()))
    return layer


def base_layer(
    cache: Path, packages: list[str], progress: Progress
) -> tuple[Path, ocilayout.Layer]:
    """The Debian layer (built when not cached) and the root filesystem it was packed from.
    The caller holds the cache lock."""
    into = cache / f"base-{base_key(packages)}"
    marker = into / "layer.json"
    if marker.exists():
        return into / "rootfs", ocilayout.Layer.from_json(json.loads(marker.read_text()))
    return into / "rootfs", _build_base(packages, into, progress)


def _wheels(root: Path, work: Path, pins: list[str], progress: Progress) -> Path:
    """The pilotfish wheel, built from a copy of its inputs (the checkout gets no build/), and
    every dependency's wheel at its pinned version."""
    src, wheels = work / "src", work / "wheels"
    for path in wheel_inputs(root):
        target = src / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    progress("pip wheel --no-deps .")
    _run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(src)])
    (wheel,) = wheels.glob("pilotfish-*.whl")
    (wheels / "constraints.txt").write_text("".join(f"{p}\n" for p in pins))
    progress(f"pip download: {len(pins)} pinned dependencies")
    _run(
        [
            *pip,
            "download",
            "--only-binary=:all:",
            "-d",
            str(wheels),
            "-c",
            str(wheels / "constraints.txt"),
            str(wheel),
        ]
    )
    return wheel


def _install_venv(rootfs: Path, work: Path, wheel: Path) -> Path:
    """Install the wheels into a venv inside a copy of the Debian root, with its own Python,
    so the venv's interpreter, shebangs and bytecode are the image's."""
    chroot = work / "root"
    _run(["cp", "-a", "--reflink=auto", str(rootfs), str(chroot)])
    shutil.copytree(work / "wheels", chroot / "tmp" / "wheels")
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "SOURCE_DATE_EPOCH": str(EPOCH),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    _run(["chroot", str(chroot), "/usr/bin/python3", "-m", "venv", VENV], env=env)
    _run(
        [
            "chroot",
            str(chroot),
            f"{VENV}/bin/pip",
            "install",
            "-q",
            "--no-index",
            "--no-cache-dir",
            "--find-links",
            "/tmp/wheels",
            "-c",
            "/tmp/wheels/constraints.txt",
            f"/tmp/wheels/{wheel.name}",
        ],
        env=env,
    )
    return chroot


def _inspect(chroot: Path) -> dict[str, Any]:
    """Run the console script as the image's user (a broken wheel fails the build here) and
    record the versions inside for the build's report."""
    env = {"PATH": ENV[0].removeprefix("PATH="), "HOME": HOME, "PYTHONDONTWRITEBYTECODE": "1"}
    user = f"--userspec={UID}:{UID}"
    _run(["chroot", user, str(chroot), "pilotfish", "--help"], env=env)
    code = (
        "import json, platform, importlib.metadata as m, pilotfish.operators, "
        "pilotfish.extender, pilotfish.webhooks; print(json.dumps({'python': "
        "platform.python_version(), 'packages': {d.metadata['Name']: d.version "
        "for d in m.distributions()}}))"
    )
    info: dict[str, Any] = json.loads(
        _run(["chroot", user, str(chroot), "python", "-c", code], env=env)
    )
    info["debian"] = _run(
        [
            "chroot",
            str(chroot),
            "dpkg-query",
            "-W",
            "-f",
            "${Package}=${Version}\\n",
            *read_packages(),
        ],
        env=env,
    ).split()
    return info


def build_image(cache: Path | None = None, progress: Progress | None = None) -> Path:
    """Build (or find cached) the image; return its OCI archive, named `ref()` inside."""
    say = progress or (lambda _msg: None)
    root = checkout()
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    packages = read_packages(root)
    pins = dependency_pins(root)
    key = app_key(root, base_key(packages), pins)
    archive = cache / f"pilotfish-{pilotfish.__version__}-{key}.oci.tar"
    if archive.exists():
        return archive
    if os.geteuid() != 0:
        raise RuntimeError("building the image needs root (mmdebstrap --mode=root, chroot)")
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():  # built by the build we waited for
            return archive
        rootfs, base = base_layer(cache, packages, say)
        work = cache / f"work-{key}"
        shutil.rmtree(work, ignore_errors=True)
        try:
            wheel = _wheels(root, work, pins, say)
            say(f"installing {wheel.name} into {VENV}")
            chroot = _install_venv(rootfs, work, wheel)
            info = _inspect(chroot)
            say("packing the venv layer")
            app = ocilayout.pack_layer(
                chroot / VENV.lstrip("/"),
                work / "venv.tar.gz",
                prefix=VENV.lstrip("/"),
                epoch=EPOCH,
            )
            labels = {
                "org.opencontainers.image.title": "pilotfish",
                "org.opencontainers.image.version": pilotfish.__version__,
                "org.opencontainers.image.base.name": f"debian:{SUITE}",
            }
            ocilayout.write_layout(
                work / "layout", [base, app], image_config(), ref=ref(), labels=labels
            )
            ocilayout.write_archive(work / "layout", archive)
            archive.with_suffix(".json").write_text(json.dumps(info, indent=1, sort_keys=True))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _prune(cache, keep=KEEP_ARCHIVES)
    return archive


def _prune(cache: Path, keep: int) -> None:
    """Drop all but the `keep` newest archives: every source edit makes a new one."""
    archives = sorted(cache.glob("pilotfish-*.oci.tar"), key=lambda p: p.stat().st_mtime)
    for old in archives[:-keep]:
        old.unlink()
        old.with_suffix(".json").unlink(missing_ok=True)


def versions(archive: Path) -> dict[str, Any]:
    """What `build_image` recorded about the image: Python, Debian's and PyPI's versions."""
    data: dict[str, Any] = json.loads(archive.with_suffix(".json").read_text())
    return data


def cli(*, as_json: bool = False, scheduler: bool = False) -> int:
    """`pilotfish dev image`: build, then print each archive path and its reference."""
    start = time.monotonic()

    def progress(msg: str) -> None:
        print(f"image: {time.monotonic() - start:6.1f}s {msg}", file=sys.stderr)

    archive = build_image(progress=progress)
    progress(f"done: {archive.stat().st_size / 2**20:.1f} MiB")
    built: dict[str, Any] = {"archive": str(archive), "ref": ref(), **versions(archive)}
    if scheduler:
        from pilotfish.devcluster import schedulerimage

        sched = schedulerimage.build_scheduler_image(progress=progress)
        progress(f"done: {sched.stat().st_size / 2**20:.1f} MiB")
        built["scheduler"] = {"archive": str(sched), "ref": schedulerimage.ref()}
    if as_json:
        print(json.dumps(built, indent=1))
        return 0
    print(archive)
    print(ref())
    if scheduler:
        print(built["scheduler"]["archive"])
        print(built["scheduler"]["ref"])
    return 0
