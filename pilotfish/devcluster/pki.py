"""The local control plane's PKI: one CA, serving certs, client certs, the SA signing key.

Made once per state directory and reused by `dev up`, so a restarted cluster keeps its
kubeconfigs valid (a state directory from before a certificate existed gets it on the next
`up`). Client identities are the ones RBAC already knows (system:masters for the admin,
system:kube-scheduler, system:kube-controller-manager), so each built-in component runs with
its own least-privilege bindings rather than as cluster admin.

The webhooks and the extender require client certificates signed by this CA: kube-apiserver
presents `webhook-client` (through its AdmissionConfiguration), kube-scheduler presents its
own `kube-scheduler` certificate (the extender's tlsConfig), and health checks, tests and
benchmarks on the host present `local-probe` (`client_context`).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
# Client identities: file stem -> (common name, organisation or None).
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("pilotfish-admin", "system:masters"),
    "kube-scheduler": ("system:kube-scheduler", None),
    "kube-controller-manager": ("system:kube-controller-manager", None),
    "kwok": ("pilotfish-kwok", "system:masters"),
    # kube-apiserver calling the admission webhooks; no API server group: it is not a user.
    "webhook-client": ("kube-apiserver-webhook-client", None),
    # Health checks, tests and benchmarks calling the webhooks and the extender.
    "local-probe": ("pilotfish-local-probe", None),
    # The local Prometheus: lists nodes (its own ClusterRole) and scrapes the host processes.
    "prometheus": ("pilotfish-prometheus", None),
}
# Serving certificates of Pilotfish's host processes, called on loopback.
LOOPBACK_SERVERS = ("webhooks", "extender")


@dataclass(frozen=True)
class Pki:
    """Paths of every file in a state directory's pki/ folder."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.root / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.root / "sa.pub"

    def cert(self, name: str) -> Path:
        return self.root / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.root / f"{name}.key"


def client_context(pki: Pki, identity: str = "local-probe") -> ssl.SSLContext:
    """TLS client context that trusts this CA and presents `identity`'s certificate: what
    anything on the host needs to call the local webhooks or extender."""
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.cert(identity)), str(pki.key(identity)))
    return context


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    *,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    client: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def ensure(root: Path, extra_server_ips: tuple[str, ...] = ()) -> Pki:
    """Create whatever part of the PKI is missing under `root`; keep what exists."""
    pki = Pki(root)
    root.mkdir(parents=True, exist_ok=True)
    if not pki.ca_cert.exists():
        ca_key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name("pilotfish-dev-ca")
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY * 5)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(pki.ca_key, ca_key)
        pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    loaded = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key}: expected an EC private key")
    ca_key = loaded

    def issue(
        name: str,
        subject: x509.Name,
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
        client: bool = False,
    ) -> None:
        if pki.cert(name).exists() and pki.key(name).exists():
            return
        cert, key = _issue(
            ca_cert,
            ca_key,
            subject,
            server_names=server_names,
            server_ips=server_ips,
            client=client,
        )
        _write_key(pki.key(name), key)
        pki.cert(name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    issue(
        "apiserver",
        _name("kube-apiserver"),
        server_names=APISERVER_DNS,
        server_ips=("127.0.0.1", "10.96.0.1", *extra_server_ips),
    )
    # Webhooks and the extender are called on loopback by the API server and kube-scheduler.
    for stem in LOOPBACK_SERVERS:
        issue(
            stem,
            _name(f"pilotfish-{stem}"),
            server_names=("localhost",),
            server_ips=("127.0.0.1",),
        )
    for stem, (cn, org) in CLIENTS.items():
        issue(stem, _name(cn, org), client=True)
    if not pki.sa_key.exists():
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(pki.sa_key, sa)
        pki.sa_pub.write_bytes(
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return pki
