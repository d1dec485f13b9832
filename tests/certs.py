"""Certificates for the access-control tests, made with openssl: CAs and the leaves they sign
(servers and clients, valid, expired, with chosen names), and bcrypt hashes; plus TLS clients."""

from __future__ import annotations

import http.client
import ssl
import subprocess
from pathlib import Path


class Certificates:
    """CAs and certificates under *directory*: ``ca(name)`` then ``leaf(name, ca=...)``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def _run(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.dir, timeout=60)

    def ca(self, name: str = "ca") -> Path:
        """A self-signed CA: ``<name>.pem`` (its key ``<name>.key``)."""
        self._run(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.pem",
        )  # fmt: skip
        return self.dir / f"{name}.pem"

    def leaf(
        self, name: str, ca: str = "ca", *, days: int = 2, san: str = "IP:127.0.0.1,DNS:localhost"
    ) -> tuple[Path, Path]:
        """(certificate, key) of *name*, signed by CA *ca*; ``days=-1``: expired yesterday."""
        (self.dir / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        self._run(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr",
        )  # fmt: skip
        self._run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", str(days), "-extfile", f"{name}.ext", "-out", f"{name}.pem",
        )  # fmt: skip
        return self.dir / f"{name}.pem", self.dir / f"{name}.key"


def client_context(ca: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A TLS client trusting *ca*, presenting *cert* (certificate, key) when given."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def https_get(
    port: int, path: str, ctx: ssl.SSLContext, headers: dict[str, str] | None = None, timeout: float = 10
) -> tuple[int, dict[str, str], bytes, list[tuple[str, str]]]:
    """(status, headers, body, every header as sent) of ``GET https://127.0.0.1:<port><path>``."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read(), resp.getheaders()
    finally:
        conn.close()


def http_get(
    port: int, path: str, headers: dict[str, str] | None = None, timeout: float = 10
) -> tuple[int, dict[str, str], bytes, list[tuple[str, str]]]:
    """The same over plain HTTP."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read(), resp.getheaders()
    finally:
        conn.close()


def bcrypt_hash(password: str, cost: int = 4) -> str:
    """A bcrypt hash of *password* as htpasswd writes it (``$2y$``; cost 4 keeps tests fast)."""
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode().replace("$2b$", "$2y$", 1)
