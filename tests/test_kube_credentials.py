"""The components' own kubeconfig and in-cluster reading (`pilotfish.kube.credentials`), and
that no component process imports the official clients (with kopf: ~40 MB of the operator)."""

from __future__ import annotations

import base64
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pilotfish.kube import credentials as cr
from pilotfish.kube.rest import Rest
from pilotfish.kube.transport import HttpTransport, encode, query
from tests.test_maintenance_controller import self_signed


def kubeconfig(tmp_path: Path, user: str, cluster: str = "server: https://10.0.0.1:6443") -> Path:
    p = tmp_path / "sub" / "config"
    p.parent.mkdir(exist_ok=True)
    p.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: main\n"
        f"clusters:\n- name: c\n  cluster: {{{cluster}}}\n"
        f"users:\n- name: u\n  user: {{{user}}}\n"
        "contexts:\n- name: main\n  context: {cluster: c, user: u}\n"
        "- name: other\n  context: {cluster: c}\n"
    )
    return p


def test_relative_files_are_read_beside_the_kubeconfig(tmp_path: Path) -> None:
    p = kubeconfig(
        tmp_path,
        "client-certificate: certs/op.crt, client-key: /abs/op.key",
        "server: 'https://10.0.0.1:6443/', certificate-authority: ca.crt",
    )
    c = cr.from_kubeconfig(p)
    assert c.server == "https://10.0.0.1:6443"
    assert c.ca_file == str(p.parent / "ca.crt")
    assert c.cert_file == str(p.parent / "certs" / "op.crt") and c.key_file == "/abs/op.key"
    assert c.token is None and not c.insecure


def test_inline_data_is_decoded_and_a_bad_one_named(tmp_path: Path) -> None:
    pem = base64.b64encode(b"PEM").decode()
    c = cr.from_kubeconfig(kubeconfig(tmp_path, f"client-certificate-data: {pem}, token: t"))
    assert c.cert_data == b"PEM" and c.token == "t"
    with pytest.raises(cr.CredentialsError, match="client-key-data is not base64"):
        cr.from_kubeconfig(kubeconfig(tmp_path, "client-key-data: '%%%'"))


@pytest.mark.parametrize("how", ["exec", "auth-provider", "username"])
def test_a_login_the_component_cannot_run_is_refused_by_name(tmp_path: Path, how: str) -> None:
    with pytest.raises(cr.CredentialsError, match=f"user 'u' authenticates with '{how}'"):
        cr.from_kubeconfig(kubeconfig(tmp_path, f"{how}: {{}}"))


def test_missing_parts_are_named(tmp_path: Path) -> None:
    p = kubeconfig(tmp_path, "token: t")
    with pytest.raises(cr.CredentialsError, match="no context named 'nope'"):
        cr.from_kubeconfig(p, "nope")
    assert cr.from_kubeconfig(p, "other").token is None  # a context without a user
    with pytest.raises(cr.CredentialsError, match="has no server"):
        cr.from_kubeconfig(kubeconfig(tmp_path, "token: t", "insecure-skip-tls-verify: true"))
    with pytest.raises(cr.CredentialsError, match="cannot read kubeconfig"):
        cr.from_kubeconfig(tmp_path / "absent")


def test_a_token_file_is_read_again_after_a_minute_or_when_asked(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    c = cr.Credentials(server="https://x", token_file=str(token))
    assert c.bearer(now=100.0) == "one"
    token.write_text("two")
    assert c.bearer(now=159.0) == "one"
    assert c.bearer(now=160.0) == "two"
    token.write_text("three")
    assert c.bearer(now=161.0, fresh=True) == "three"


def test_in_cluster_reads_the_service_environment_and_mounted_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    c = cr.in_cluster(env, tmp_path)
    assert c.server == "https://[fd00::1]:443" and c.ca_file == str(tmp_path / "ca.crt")
    assert c.bearer() == "sa-token"
    with pytest.raises(cr.CredentialsError, match="KUBERNETES_SERVICE_HOST"):
        cr.in_cluster({}, tmp_path)


def test_query_and_body_are_encoded_as_the_api_reads_them() -> None:
    assert query({"watch": True, "dryRun": False, "limit": 500}) == [
        ("watch", "true"),
        ("dryRun", "false"),
        ("limit", "500"),
    ]
    assert encode({"a": [1]}) == b'{"a":[1]}' and encode("kind: X") == b"kind: X"
    assert encode(None) is None and encode(b"raw") == b"raw"


async def test_requests_carry_the_token_params_and_body(tmp_path: Path) -> None:
    seen: list[tuple[str, str, str, bytes]] = []

    async def handle(req: web.Request) -> web.Response:
        seen.append((req.method, req.headers["Authorization"], req.query_string, await req.read()))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/api/v1/pods", handle)
    async with TestServer(app) as server:
        t = HttpTransport(cr.Credentials(server=f"http://127.0.0.1:{server.port}", token="tk"))
        try:
            rest = Rest(t)
            assert await rest.get("/api/v1/pods", labelSelector="a=b,c") == {"ok": True}
            assert await rest.create("/api/v1/pods", {"x": 1}) == {"ok": True}
        finally:
            await t.close()
    assert seen[0][:3] == ("GET", "Bearer tk", "labelSelector=a%3Db,c")
    assert seen[1][0] == "POST" and seen[1][3] == b'{"x":1}'


def test_no_component_imports_kubernetes_asyncio() -> None:
    code = (
        "import sys, pilotfish.cli.main, pilotfish.operators.runner, "
        "pilotfish.extender.server, pilotfish.webhooks.server, "
        "pilotfish.operators.maintenance.kopfwire; "
        "print(sorted(m for m in sys.modules if m.startswith('kubernetes')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_refused_import_fails_inside_the_block_only() -> None:
    code = (
        "import sys\n"
        "from pilotfish.importing import without\n"
        "with without('kubernetes'):\n"
        "    try:\n"
        "        import kubernetes.client\n"
        "    except ModuleNotFoundError:\n"
        "        print('refused')\n"
        "import kubernetes.client\n"
        "print('kubernetes' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["refused", "True"]


def test_inline_certificates_load_and_leave_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crt, key = self_signed(tmp_path)
    # A temporary directory of this test's own: other workers' files cannot show up in it.
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    c = cr.Credentials(
        server="https://x",
        ca_data=crt.read_bytes(),
        cert_data=crt.read_bytes(),
        key_data=key.read_bytes(),
    )
    assert c.ssl_context() is not None
    assert list(temp.iterdir()) == []
