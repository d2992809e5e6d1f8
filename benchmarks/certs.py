"""A throwaway cluster CA and one host certificate, for TLS tests and benchmarks.

Uses the ``openssl`` command line (present wherever the ssl module is); the files go
into a directory the caller owns. One certificate serves every host of a local tree:
the daemons check the CA's signature, not the host name (see ``crnet/tls.py``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from crnet.tls import TlsFiles


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def make_cluster_certs(directory: str | Path) -> TlsFiles:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=crnet test CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "host.key", "-out", "host.csr", "-subj", "/CN=crnet host")
    run("x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "host.pem", "-days", "2")
    for name in ("ca.key", "host.key"):
        (d / name).chmod(0o600)
    return TlsFiles(str(d / "host.pem"), str(d / "host.key"), str(d / "ca.pem"))
