"""A throwaway cluster CA and host certificates, for the TLS tests (the ``certs`` fixture).

The tests' own, so that they take no certificates from benchmarks/: ``benchmarks/certs.py``
makes the same for bench_hop and bench_step (and stays, for them). Uses the ``openssl`` command line
(present wherever the ssl module is); the files go into a directory the caller owns.
``make_cluster_certs``: one certificate serves every host of a local tree (the daemons check
the CA's signature, not the host name: see ``crnet/protocol/tls.py``). ``make_host_certs``: a
certificate per host, each naming its host id (a DNS subjectAltName), for ``--tls-names``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from crnet.protocol.tls import TlsFiles


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def make_cluster_certs(directory: str | Path) -> TlsFiles:
    """A CA and the one certificate every host of a local tree serves, in ``directory``."""
    return _Ca(Path(directory)).host("host", None)


def make_host_certs(directory: str | Path, host_ids: list[str]) -> dict[str, TlsFiles]:
    """One certificate per host id, each naming it, all signed by one CA in ``directory``."""
    ca = _Ca(Path(directory))
    return {host: ca.host(f"host-{i}", host) for i, host in enumerate(host_ids)}


class _Ca:
    """The CA (ca.pem, ca.key) in ``d``, made once; ``host`` signs a host certificate."""

    KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")

    def __init__(self, d: Path):
        self.d = d
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "ca.pem").exists():
            self._openssl("req", "-x509", *self.KEY, "-keyout", "ca.key", "-out", "ca.pem",
                          "-days", "2", "-subj", "/CN=crnet test CA")
            (d / "ca.key").chmod(0o600)

    def host(self, stem: str, san: str | None) -> TlsFiles:
        """``stem``.pem (key ``stem``.key); with ``san``, it names that host (DNS:``san``)."""
        self._openssl("req", *self.KEY, "-keyout", f"{stem}.key", "-out", f"{stem}.csr",
                      "-subj", "/CN=crnet host")
        extra: list[str] = []
        if san is not None:
            (self.d / f"{stem}.ext").write_text(f"subjectAltName=DNS:{san}\n")
            extra = ["-extfile", f"{stem}.ext"]
        self._openssl("x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                      "-CAcreateserial", "-out", f"{stem}.pem", "-days", "2", *extra)
        (self.d / f"{stem}.key").chmod(0o600)
        return TlsFiles(str(self.d / f"{stem}.pem"), str(self.d / f"{stem}.key"), str(self.d / "ca.pem"))

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.d)
