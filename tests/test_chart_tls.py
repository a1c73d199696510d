"""The chart's mutual TLS: the scheduler and the extender always, the webhooks on request.

Rendered with the pinned helm, then checked as a running pair would use it: the certificates
the chart generates must chain, carry the right usages and be mounted where the flags and
the scheduler configuration say.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path
from typing import Any

import yaml

from pilotfish import httpserver
from pilotfish.devcluster import pki
from tests.test_chart_values import needs_helm, render


def by_name(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def container(docs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    spec = by_name(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    first: dict[str, Any] = spec["containers"][0]
    return first


def mounted_secret(docs: list[dict[str, Any]], deployment: str, path: str) -> str:
    spec = by_name(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    name: str = volume["secret"]["secretName"]
    return name


def write_secret(docs: list[dict[str, Any]], name: str, into: Path) -> Path:
    into.mkdir()
    for key, value in by_name(docs, "Secret", name)["data"].items():
        (into / key).write_bytes(base64.b64decode(value))
    return into


@needs_helm
def test_scheduler_calls_the_extender_over_mutual_tls(tmp_path: Path) -> None:
    docs = render()
    extender = container(docs, "pilotfish-extender")
    assert {"--cert=/certs/tls.crt", "--key=/certs/tls.key", "--client-ca=/certs/ca.crt"} <= set(
        extender["args"]
    )
    for probe in (extender["livenessProbe"], extender["readinessProbe"]):
        assert probe["httpGet"]["port"] == "health"  # kubelet has no client certificate
    config = by_name(docs, "ConfigMap", "pilotfish-scheduler-config")
    for ext in yaml.safe_load(config["data"]["config.yaml"])["extenders"]:
        assert ext["urlPrefix"] == "https://pilotfish-extender.pilotfish-system.svc:443"
        assert ext["enableHTTPS"] is True
        assert ext["tlsConfig"] == {
            "caFile": "/etc/pilotfish-scheduler-tls/ca.crt",
            "certFile": "/etc/pilotfish-scheduler-tls/tls.crt",
            "keyFile": "/etc/pilotfish-scheduler-tls/tls.key",
        }
    served = write_secret(
        docs, mounted_secret(docs, "pilotfish-extender", "/certs"), tmp_path / "extender"
    )
    client = write_secret(
        docs,
        mounted_secret(docs, "pilotfish-scheduler", "/etc/pilotfish-scheduler-tls"),
        tmp_path / "scheduler",
    )
    assert (client / "tls.key").read_bytes() != (served / "tls.key").read_bytes()
    server = httpserver.server_tls(
        str(served / "tls.crt"), str(served / "tls.key"), str(served / "ca.crt")
    )
    scheduler = ssl.create_default_context(cafile=str(client / "ca.crt"))
    scheduler.load_cert_chain(str(client / "tls.crt"), str(client / "tls.key"))
    assert asyncio.run(handshake(server, scheduler)) == b"ok"
    # A client certificate from any other CA is refused.
    stranger = pki.client_context(pki.ensure(tmp_path / "other"))
    stranger.load_verify_locations(cafile=str(client / "ca.crt"))
    stranger.check_hostname = False
    assert asyncio.run(handshake(server, stranger)) == b""


EXTENDER_HOST = "pilotfish-extender.pilotfish-system.svc"


async def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, host: str = EXTENDER_HOST
) -> bytes:
    """What a client reads from a TLS server that writes b"ok" (b"" when refused), the client
    checking the server's certificate for `host`."""

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listening = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
    port = listening.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname=host
        )
        try:
            return await reader.read()
        except (ssl.SSLError, ConnectionResetError):
            return b""
        finally:
            writer.close()
    except (ssl.SSLError, ConnectionResetError):
        return b""
    finally:
        listening.close()


@needs_helm
def test_webhook_client_auth_is_off_until_given_the_api_servers_ca() -> None:
    docs = render()
    webhooks = container(docs, "pilotfish-webhooks")
    assert not [a for a in webhooks["args"] if a.startswith("--client-ca")]
    assert not [d for d in docs if d["metadata"]["name"] == "pilotfish-webhooks-client-ca"]
    for probe in (webhooks["livenessProbe"], webhooks["readinessProbe"]):
        assert probe["httpGet"]["port"] == "health"

    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    docs = render(f"webhooks.clientAuth.caCert={pem}")
    webhooks = container(docs, "pilotfish-webhooks")
    assert "--client-ca=/client-ca/ca.crt" in webhooks["args"]
    spec = by_name(docs, "Deployment", "pilotfish-webhooks")["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "client-ca"]
    ca = by_name(docs, "ConfigMap", volume["configMap"]["name"])
    assert ca["data"]["ca.crt"] == pem
    assert {"name": "client-ca", "mountPath": "/client-ca", "readOnly": True} in webhooks[
        "volumeMounts"
    ]


@needs_helm
def test_prometheus_scrapes_the_plain_metrics_ports() -> None:
    docs = render()
    for service in ("pilotfish-extender", "pilotfish-webhooks"):
        ports = {p["name"]: p for p in by_name(docs, "Service", service)["spec"]["ports"]}
        assert ports["metrics"]["targetPort"] == "health"
        assert ports["https"]["port"] == 443


@needs_helm
def test_local_mode_renders_no_certificates() -> None:
    docs = render("local.enabled=true", "local.caBundle=Zm9v")
    assert not [d for d in docs if d["kind"] == "Secret"]
    config = by_name(docs, "ConfigMap", "pilotfish-scheduler-config")
    for ext in yaml.safe_load(config["data"]["config.yaml"])["extenders"]:
        assert ext["urlPrefix"] == "https://127.0.0.1:16300"
