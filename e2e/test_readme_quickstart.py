"""The README's quick-start lines, run verbatim in bash against the session's cluster.

The lines are the demo section's sh block: the `export` line the demo prints (KUBECONFIG, the
pinned binaries and the plugin first on PATH), then kubectl and `kubectl pilotfish`. They run
as a person would paste them into a fresh shell at the checkout's root: a PATH without the
virtualenv (so `kubectl pilotfish` is found only if the export line puts it there) and with
the system's own kubectl, if any, in /usr/bin. The only change to the text is the state
directory: the session's cluster instead of the default one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from e2e.conftest import Env
from pilotfish.devcluster import binaries

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEFAULT_KUBECONFIG = "~/.local/state/pilotfish/dev/kubeconfig"
FRESH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MARK = "--- where ---"


def quickstart() -> list[str]:
    """The sh block that has both the export line and `kubectl pilotfish gates -A`."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    for block in blocks:
        lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
        if "kubectl pilotfish gates -A" in lines and any(ln.startswith("export ") for ln in lines):
            return lines
    raise AssertionError(f"{README} has no sh block with the export line and gates -A")


def test_the_readme_quickstart_block_is_there_and_starts_with_the_export_line() -> None:
    lines = quickstart()
    assert lines[0].startswith("export KUBECONFIG=")
    assert DEFAULT_KUBECONFIG in lines[0]
    assert "PATH=" in lines[0] and ".venv/bin" in lines[0]
    assert not any(ln.startswith("make ") for ln in lines), "it must not stop the cluster"


def test_the_readme_quickstart_lines_run_verbatim(env: Env) -> None:
    lines = [ln.replace(DEFAULT_KUBECONFIG, str(env.kubeconfig)) for ln in quickstart()]
    script = "\n".join(
        [
            "set -eE -o pipefail",
            "trap 'echo \"quick-start line failed (exit $?): $BASH_COMMAND\" >&2' ERR",
            *lines,
            f"echo {MARK}",
            "command -v kubectl kubectl-pilotfish",
        ]
    )
    environ = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "VIRTUAL_ENV")}
    environ["PATH"] = FRESH_PATH
    if env.layout is not None:
        environ["PILOTFISH_STATE"] = str(env.layout.root)
    res = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    out, where = res.stdout.split(f"{MARK}\n")
    kubectl, plugin = where.split()
    assert kubectl == str(binaries.bin_dir() / "kubectl"), where
    assert Path(plugin).parent == Path(sys.executable).parent, where

    # The pinned kubectl is the API server's version (a system kubectl may not be).
    versions = dict(re.findall(r"^(Client|Server) Version: v(\d+\.\d+)", out, flags=re.M))
    assert versions.get("Client") and versions.get("Client") == versions.get("Server"), out
    # `kubectl get pilotfish -A` and `kubectl pilotfish gates -A` reached the cluster.
    assert "No pods hold Pilotfish gates" in res.stderr or "NAMESPACE" in out, out
    assert "serviceworkloads" in out  # `kubectl pilotfish status` counted Pilotfish objects
