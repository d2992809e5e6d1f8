"""A throwaway cluster CA and host certificates, for TLS tests and benchmarks.

Uses the ``openssl`` command line (present wherever the ssl module is); the files go
into a directory the caller owns. ``make_cluster_certs``: one certificate serves every
host of a local tree (the daemons check the CA's signature, not the host name: see
``crnet/protocol/tls.py``). ``make_host_certs``: a certificate per host, each naming its host id
(a DNS subjectAltName), for ``--tls-names``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from crnet.protocol.tls import TlsFiles


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def _openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)


def _ca(d: Path) -> None:
    """The CA (ca.pem, ca.key) in ``d``, made once."""
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "ca.pem").exists():
        _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj",
                 "/CN=crnet test CA")
        (d / "ca.key").chmod(0o600)


def _host(d: Path, stem: str, san: str | None) -> TlsFiles:
    """A host certificate ``stem``.pem (key ``stem``.key) signed by the CA in ``d``; with
    ``san``, it names that host (subjectAltName DNS:``san``)."""
    _openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", "/CN=crnet host")
    extra: list[str] = []
    if san is not None:
        (d / f"{stem}.ext").write_text(f"subjectAltName=DNS:{san}\n")
        extra = ["-extfile", f"{stem}.ext"]
    _openssl(d, "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{stem}.pem", "-days", "2", *extra)
    (d / f"{stem}.key").chmod(0o600)
    return TlsFiles(str(d / f"{stem}.pem"), str(d / f"{stem}.key"), str(d / "ca.pem"))


def make_cluster_certs(directory: str | Path) -> TlsFiles:
    d = Path(directory)
    _ca(d)
    return _host(d, "host", None)


def make_host_certs(directory: str | Path, host_ids: list[str]) -> dict[str, TlsFiles]:
    """One certificate per host id, each naming it, all signed by one CA in ``directory``."""
    d = Path(directory)
    _ca(d)
    return {host: _host(d, f"host-{i}", host) for i, host in enumerate(host_ids)}
