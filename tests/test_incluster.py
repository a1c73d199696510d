"""The in-cluster install's flags: the README's steps are the ones the e2e runs, and the
chart renders them into Deployments on the real node, from the offline image, never pulled."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pilotfish import names
from pilotfish.devcluster import binaries, incluster
from pilotfish.devcluster.imagespec import IMAGE_REF

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "pilotfish"


def readme_helm_install() -> list[str]:
    """The README's `helm install` command of the in-cluster steps, as argv."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Installing on kind or a real cluster") :]
    start = section.index("helm install pilotfish charts/pilotfish")
    lines = []
    for line in section[start:].splitlines():
        lines.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(lines))


def test_the_readme_installs_with_exactly_the_tested_flags() -> None:
    argv = readme_helm_install()
    head = ["helm", "install", "pilotfish", "charts/pilotfish"]
    head += ["-n", names.SYSTEM_NAMESPACE, "--create-namespace"]
    assert argv == [*head, *incluster.install_args(IMAGE_REF), "--wait", "--timeout", "5m"]


def test_the_readme_imports_the_ref_the_chart_runs() -> None:
    repository, tag = IMAGE_REF.rsplit(":", 1)
    args = incluster.install_args(IMAGE_REF)
    assert f"image.repository={repository}" in args
    assert f"image.tag={tag}" in args
    assert f"--index-name {IMAGE_REF}" in (ROOT / "README.md").read_text()


def test_the_api_route_is_one_dnat_rule_on_the_bridge_to_loopback() -> None:
    rule = incluster.api_route_rule("pfbr3000", "10.96.0.1", 19443)
    joined = " ".join(rule)
    assert joined.startswith("-i pfbr3000 -d 10.96.0.1/32 -p tcp --dport 443 ")
    assert joined.endswith("-j DNAT --to-destination 127.0.0.1:19443")


def render(*extra: str) -> list[dict[str, Any]]:
    try:
        helm = binaries.helm(binaries.bin_dir())
    except binaries.MissingBinaries as e:
        pytest.skip(f"pinned helm not built: {e}")
    res = subprocess.run(
        [str(helm), "template", "pilotfish", str(CHART), "-n", names.SYSTEM_NAMESPACE, *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def test_every_deployment_lands_on_the_real_node_from_the_imported_image() -> None:
    docs = render(*incluster.install_args(IMAGE_REF))
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {
        "pilotfish-operator",
        "pilotfish-extender",
        "pilotfish-webhooks",
        "pilotfish-scheduler",
    }
    for name, d in deployments.items():
        spec = d["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == incluster.ON_REAL_NODE_SELECTOR, name
        assert spec["tolerations"] == incluster.ON_REAL_NODE_TOLERATIONS, name
        want = 0 if name == "pilotfish-scheduler" else 1
        assert d["spec"]["replicas"] == want, name
        if name != "pilotfish-scheduler":
            container = spec["containers"][0]
            assert container["image"] == IMAGE_REF, name
            assert container["imagePullPolicy"] == "Never", name
    assert json.dumps(incluster.ON_REAL_NODE_TOLERATIONS)  # serialisable for --set-json
