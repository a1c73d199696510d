"""Local mode wires mutual TLS end to end: who presents which certificate to whom.

kube-apiserver presents `webhook-client` to the webhooks (AdmissionConfiguration ->
kubeconfig user named after the webhooks' host:port), kube-scheduler presents its own
certificate to the extender (tlsConfig), the health checks present `local-probe`, and both
servers are started requiring a client certificate from the dev CA.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from pilotfish.devcluster import components, pki
from pilotfish.devcluster.cluster import ClusterSpec, host_processes
from pilotfish.devcluster.components import Layout, Ports


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_api_server_authenticates_to_the_webhooks_by_their_host_and_port(
    tmp_path: Path,
) -> None:
    layout, p = Layout(tmp_path), Ports().shifted(5)
    (apiserver,) = [
        c for c in components.control_plane(layout, p, tmp_path) if "apiserver" in c.name
    ]
    assert f"--admission-control-config-file={layout.admission_config}" in apiserver.argv
    config = components.admission_config(layout)
    assert config["kind"] == "AdmissionConfiguration"
    plugins = {plugin["name"]: plugin["configuration"] for plugin in config["plugins"]}
    assert set(plugins) == {"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"}
    for plugin in plugins.values():
        assert plugin["kind"] == "WebhookAdmissionConfiguration"
        assert plugin["kubeConfigFile"] == str(layout.webhook_kubeconfig)
    (user,) = components.webhook_kubeconfig(layout, p)["users"]
    assert user["name"] == f"127.0.0.1:{p.webhooks}"
    # The certificate it names is a client certificate of the CA the webhooks trust.
    certs = pki.ensure(layout.pki.root)
    assert user["user"]["client-certificate"] == str(certs.cert("webhook-client"))
    cert = x509.load_pem_x509_certificate(certs.cert("webhook-client").read_bytes())
    ca = x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_host_processes_require_client_certificates_and_are_probed_with_one(
    tmp_path: Path,
) -> None:
    layout = Layout(tmp_path)
    procs = {c.name: c for c in host_processes(layout, ClusterSpec().ports)}
    certs = layout.pki
    for name in ("pilotfish-extender", "pilotfish-webhooks"):
        proc = procs[name]
        assert flag(proc.argv, "--client-ca") == str(certs.ca_cert), name
        assert proc.health.url.startswith("https://127.0.0.1:"), name
        assert proc.health.client_cert == certs.cert("local-probe"), name
    extender = procs["pilotfish-extender"].argv
    assert flag(extender, "--cert") == str(certs.cert("extender"))
    assert flag(extender, "--key") == str(certs.key("extender"))
