"""The chart in-cluster, as the image will meet it: the image values reach every Pilotfish
container, its command and args are ones the image's `pilotfish` accepts, the probes hit
declared ports, and the webhooks' serving certificate is the chart's own, trusted by the
caBundle the API server is given (no certificate from outside)."""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

import pilotfish
from pilotfish import httpserver
from pilotfish.cli.main import parser
from pilotfish.devcluster import image, imagespec
from tests.test_chart_tls import (
    EXTENDER_HOST,
    by_name,
    container,
    handshake,
    mounted_secret,
    write_secret,
)
from tests.test_chart_values import needs_helm, render

PILOTFISH = ("pilotfish-operator", "pilotfish-extender", "pilotfish-webhooks")
WEBHOOK_HOST = "pilotfish-webhooks.pilotfish-system.svc"
LOCAL_IMAGE = (
    f"image.repository={imagespec.REPOSITORY}",
    f"image.tag={pilotfish.__version__}",
    "image.pullPolicy=Never",
)


@needs_helm
def test_default_tag_is_the_version_the_image_is_built_as() -> None:
    docs = render(f"image.repository={imagespec.REPOSITORY}")
    for name in PILOTFISH:
        assert container(docs, name)["image"] == image.ref()
        assert container(docs, name)["imagePullPolicy"] == "IfNotPresent"


@needs_helm
def test_image_values_reach_every_pilotfish_container() -> None:
    docs = render("image.repository=registry.example/pf", "image.tag=9.9", "image.pullPolicy=Never")
    for name in PILOTFISH:
        assert container(docs, name)["image"] == "registry.example/pf:9.9"
        assert container(docs, name)["imagePullPolicy"] == "Never"
    # The second scheduler is upstream's image, not Pilotfish's.
    assert container(docs, "pilotfish-scheduler")["image"].startswith("registry.k8s.io/")


@needs_helm
def test_pods_run_as_the_images_user() -> None:
    docs = render(*LOCAL_IMAGE)
    for name in PILOTFISH:
        spec = by_name(docs, "Deployment", name)["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsUser"] == imagespec.UID
        assert spec["securityContext"]["runAsGroup"] == imagespec.UID
        assert container(docs, name)["securityContext"]["readOnlyRootFilesystem"] is True


def pod_args(c: dict[str, Any]) -> list[str]:
    """The container's argv after the kubelet expands $(POD_IP)."""
    return [a.replace("$(POD_IP)", "10.0.0.7") for a in c["args"]]


@needs_helm
@pytest.mark.parametrize("values", [(), ("batchAccount.enabled=false",)])
def test_the_images_pilotfish_accepts_every_deployments_arguments(values: tuple[str, ...]) -> None:
    docs = render(*LOCAL_IMAGE, *values)
    for name in PILOTFISH:
        c = container(docs, name)
        assert c["command"] == list(imagespec.ENTRYPOINT)
        args = parser().parse_args(pod_args(c))
        assert args.cmd == name.removeprefix("pilotfish-")
        assert getattr(args, "host", None) in (None, "10.0.0.7")


def probe_port(c: dict[str, Any], probe: str) -> int:
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    port: int = named[c[probe]["httpGet"]["port"]]
    return port


@needs_helm
def test_probes_hit_the_plain_port_each_component_is_told_to_open() -> None:
    docs = render(*LOCAL_IMAGE)
    for name in PILOTFISH:
        c = container(docs, name)
        args = parser().parse_args(pod_args(c))
        served = args.metrics_port if name == "pilotfish-operator" else args.health_port
        for probe in ("livenessProbe", "readinessProbe"):
            assert probe_port(c, probe) == int(served), (name, probe)
            assert c[probe]["httpGet"].get("scheme", "HTTP") == "HTTP"
        assert c["readinessProbe"]["httpGet"]["path"] in ("/healthz", "/readyz")


def webhook_bundles(docs: list[dict[str, Any]]) -> list[str]:
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for d in docs:
            if d["kind"] == kind:
                for hook in d["webhooks"]:
                    assert hook["clientConfig"]["service"]["name"] == "pilotfish-webhooks"
                    assert hook["clientConfig"]["service"]["port"] == 443
                    out.append(hook["clientConfig"]["caBundle"])
    return out


@needs_helm
def test_chart_provisions_the_webhook_certificate_its_ca_bundle_trusts(tmp_path: Path) -> None:
    docs = render(*LOCAL_IMAGE)
    webhooks = container(docs, "pilotfish-webhooks")
    assert {"--cert=/certs/tls.crt", "--key=/certs/tls.key"} <= set(webhooks["args"])
    secret = mounted_secret(docs, "pilotfish-webhooks", "/certs")
    served = write_secret(docs, secret, tmp_path / "webhooks")
    bundles = set(webhook_bundles(docs))
    assert len(bundles) == 1
    (bundle,) = bundles
    assert base64.b64decode(bundle) == (served / "ca.crt").read_bytes()
    cert = x509.load_pem_x509_certificate((served / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert WEBHOOK_HOST in names.get_values_for_type(x509.DNSName)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    # The API server's side: trust only the caBundle, check the Service's name.
    server = httpserver.server_tls(str(served / "tls.crt"), str(served / "tls.key"))
    apiserver = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
    assert asyncio.run(handshake(server, apiserver, WEBHOOK_HOST)) == b"ok"
    assert asyncio.run(handshake(server, apiserver, EXTENDER_HOST)) == b""


@needs_helm
def test_each_install_without_a_secret_makes_its_own_ca() -> None:
    first = set(webhook_bundles(render(*LOCAL_IMAGE)))
    second = set(webhook_bundles(render(*LOCAL_IMAGE)))
    assert first != second  # generated, not a key shipped in the chart
