"""`pilotfish dev` flags, the shell line it prints, and the krew manifest of the plugin.

The shell line is what makes `kubectl pilotfish` work after `make demo`, so it is checked
by running it in a real shell and asking that shell where `kubectl` and the plugin are.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from pilotfish.cli import main
from pilotfish.devcluster import binaries, cluster

ROOT = Path(__file__).resolve().parent.parent
KREW = ROOT / "plugins" / "krew"


@pytest.mark.parametrize(
    ("argv", "state"),
    [
        (["dev", "--state", "/a", "down"], "/a"),
        (["dev", "down", "--state", "/b"], "/b"),
        (["dev", "--state", "/a", "down", "--state", "/b"], "/b"),
        (["dev", "up", "--state", "/c", "--nodes", "3"], "/c"),
        (["dev", "status", "--state", "/d"], "/d"),
        (["dev", "env", "--state", "/e"], "/e"),
        (["dev", "down", "--purge"], None),
    ],
)
def test_state_is_taken_before_or_after_the_verb(argv: list[str], state: str | None) -> None:
    assert main.parser().parse_args(argv).state == state


def test_dev_up_help_documents_state(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main.parser().parse_args(["dev", "up", "--help"])
    out = capsys.readouterr().out
    assert "--state" in out and "PILOTFISH_STATE" in out


def test_env_line_sets_kubeconfig_and_puts_pinned_bins_then_the_plugin_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bins = tmp_path / "pinned bin"  # a space: the line must quote
    bins.mkdir()
    for name in binaries.REQUIRED:
        (bins / name).write_text("#!/bin/sh\n")
        (bins / name).chmod(0o755)
    monkeypatch.setenv("PILOTFISH_BIN_DIR", str(bins))
    state = tmp_path / "state"
    (line,) = cluster.env_lines(state)
    assert line.startswith("export KUBECONFIG=")
    shell = subprocess.run(
        ["bash", "-c", f'{line}\necho "$KUBECONFIG"; command -v kubectl kubectl-pilotfish'],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    kubeconfig, kubectl, plugin = shell.stdout.splitlines()
    assert kubeconfig == str(state / "kubeconfig")
    assert kubectl == str(bins / "kubectl")  # before any /usr/bin/kubectl
    assert plugin == str(Path(sys.executable).parent / "kubectl-pilotfish")


def test_env_line_without_built_binaries_still_puts_the_plugin_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PILOTFISH_BIN_DIR", str(tmp_path / "nothing"))
    (line,) = cluster.env_lines(tmp_path)
    assert f"PATH={Path(sys.executable).parent}:$PATH" in line


# -- the krew manifest -------------------------------------------------------------------------


def _package() -> ModuleType:
    spec = importlib.util.spec_from_file_location("krew_package", KREW / "package.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_krew_manifest_parses_and_names_the_kubectl_pilotfish_binary() -> None:
    doc = yaml.safe_load((KREW / "pilotfish.yaml").read_text())
    assert doc["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert doc["kind"] == "Plugin"
    assert doc["metadata"]["name"] == "pilotfish"  # kubectl pilotfish <-> kubectl-pilotfish
    spec = doc["spec"]
    assert spec["version"].startswith("v") and spec["shortDescription"]
    (platform,) = spec["platforms"]
    assert platform["bin"] == "kubectl-pilotfish"
    assert {"from": "kubectl-pilotfish", "to": "."} in platform["files"]
    assert platform["selector"]["matchExpressions"][0]["values"] == ["linux", "darwin"]
    # The archive it names is the one package.py builds, byte for byte.
    assert platform["sha256"] == hashlib.sha256(_package().archive()).hexdigest()


def test_krew_launcher_runs_the_plugin_from_the_package() -> None:
    res = subprocess.run(
        [str(KREW / "kubectl-pilotfish"), "version"],
        capture_output=True,
        text=True,
        check=False,
        env={"PILOTFISH_PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("pilotfish ")


def test_krew_launcher_says_what_to_install_when_the_package_is_missing() -> None:
    res = subprocess.run(
        [str(KREW / "kubectl-pilotfish"), "version"],
        capture_output=True,
        text=True,
        check=False,
        env={"PILOTFISH_PYTHON": "/bin/false", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 1
    assert "cannot import pilotfish" in res.stderr and "pip install ." in res.stderr
