"""Issue 26, deployment and output rows: separate users for crnetd and the training processes
(row 9), a node's text printed escaped by ``crnet status`` (row 14), no loopback listener
without a secret unless asked (row 15), the secret handshake bound to the TLS connection
(row 16), and credential files others could read or replace refused (row 17)."""

from __future__ import annotations

import asyncio
import grp
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from crnet.client import Client
from crnet.coding.plan import Tree
from crnet.errors import CrnetError
from crnet.protocol.auth import load_secret, mac
from crnet.protocol.messages import StatusReply
from crnet.protocol.tls import TlsFiles, channel_binding, contexts
from crnet.tools.launch import MASTER, LocalTree
from crnet.tools.status import StatusClient

from ..helpers import REPO
from ..helpers.certs import have_openssl
from .path_proxy import PathProxy

pytestmark = pytest.mark.timeout(120)

UNIT = REPO / "scripts" / "systemd" / "crnetd.service"
ENV_FILE = UNIT.with_name("crnetd.env")
OPERATIONS = REPO / "docs" / "operations.md"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")
needs_openssl = pytest.mark.skipif(not have_openssl(), reason="needs the openssl command")
NOBODY = 65534
LEAF = ["--role", "node", "--parent", "127.0.0.1:1"]
MASTER_ARGS = ["--role", "master", "--listen", "127.0.0.1:0", "--samples", "4", "--fanout", "1",
               "--layers", "1", "--stragglers", "0"]


def crnetd(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """A real crnetd process (this worktree's crnet), its exit code and output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRNET_")}
    return subprocess.run([sys.executable, "-m", "crnet", "daemon", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def private_file(path: Path, text: str = "s3cret-" * 8, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def nogroup() -> int:
    return grp.getgrgid(NOBODY).gr_gid


# ---------------------------------------------------------------- row 9: separate users
def unit_options() -> dict[str, str]:
    return dict(line.split("=", 1) for line in UNIT.read_text().splitlines()
                if "=" in line and not line.startswith("#"))


def test_the_unit_runs_crnetd_as_another_user_than_the_training_processes():
    """crnetd is ``crnet``; the training processes are ``train`` and reach it only through
    the client socket, whose group (CRNET_CLIENT_GROUP) is theirs; the docs install the
    secret for crnet alone."""
    options = unit_options()
    env = dict(re.findall(r"^(CRNET_[A-Z_]+)=(.*)$", ENV_FILE.read_text(), re.MULTILINE))
    assert options["User"] not in ("train", "root"), options["User"]
    assert env.get("CRNET_CLIENT_GROUP") == "train"
    assert options["Group"] in ("train", options["User"])     # the socket's directory: theirs
    docs = OPERATIONS.read_text() + UNIT.read_text()
    installs = [line for line in docs.splitlines() if "/etc/crnet/secret" in line and "install" in line]
    assert installs and all("-m 600 -o crnet" in line for line in installs), installs
    assert "-g train" not in docs


@needs_root
def test_a_secret_the_training_processes_group_may_read_is_refused(tmp_path):
    secret = private_file(tmp_path / "secret", mode=0o640)
    os.chown(secret, -1, nogroup())
    group = grp.getgrgid(nogroup()).gr_name
    got = crnetd(*LEAF, "--secret-file", str(secret), "--client-group", group, "--check-config")
    assert got.returncode == 2, got.stdout + got.stderr
    assert "the training processes' (--client-group)" in got.stderr and "chmod 600" in got.stderr
    secret.chmod(0o600)
    got = crnetd(*LEAF, "--secret-file", str(secret), "--client-group", group, "--check-config")
    assert got.returncode == 0, got.stderr


@needs_root
def test_a_training_process_of_the_client_group_runs_steps_without_the_secret():
    """The deployment of the unit, on real daemons: crnetd with a secret only its user
    reads and ``--client-group``; a training process of another user in that group
    cannot read the secret, yet connects and runs steps."""
    workdir = Path(tempfile.mkdtemp(prefix="crnet-deploy-"))
    workdir.chmod(0o755)              # the client socket's directory: others may enter
    group = grp.getgrgid(nogroup()).gr_name
    lt = LocalTree(Tree((2,), (1,)), 4, workdir=workdir, secret=True, client_group=group,
                   strict=True)
    try:
        lt.start()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                  # the training process: another user, the client group
            code = 1
            try:
                os.close(read)
                os.setgid(nogroup())
                os.setuid(NOBODY)
                try:
                    (workdir / "secret").read_bytes()
                    said = "read the secret"
                except PermissionError:
                    with Client(lt.socket_path("0"), timeout=30) as c:
                        got = c.allreduce(np.ones(8), step=0)
                    said = f"step {got.shape} {bool(np.all(np.isfinite(got)))}"
                os.write(write, said.encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        said = os.read(read, 200).decode()
        os.close(read)
        assert os.waitstatus_to_exitcode(status) == 0 and said == "step (8,) True", said
    finally:
        codes = lt.stop()
        problems = lt.problems()
        shutil.rmtree(workdir, ignore_errors=True)
    assert not problems and set(codes.values()) == {0}, (codes, problems)


# ---------------------------------------------------------------- row 14: crnet status
FORGED = "10.0.0.9:7070\x1b]52;c;Y3VybCBldmlsfHNo\x07\nmissing now: none\x1b[2K"


class ForgedNode:
    """A node's listen port that answers ``crnet status`` with text of its choosing."""

    def __init__(self, node: dict):
        self.frame = b"".join(bytes(p) for p in StatusReply(0, node).frame())

    async def start(self) -> ForgedNode:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _answer(self, reader, writer):
        await reader.read(1024)       # the STATUS_HELLO
        writer.write(self.frame)
        await writer.drain()
        await reader.read()           # until the client hangs up
        writer.close()


async def test_crnet_status_prints_a_nodes_text_escaped():
    child = {"name": "0\x1b[31m", "host": "gpu-01", "address": FORGED, "state": "missing",
             "tree_step": -1, "steps_done": 0, "last_step_seconds": None, "straggled": None,
             "recent": None, "children": []}
    node = await ForgedNode({**child, "name": "", "state": "joined", "tree_step": 3,
                             "children": [child]}).start()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crnet", "status", f"127.0.0.1:{node.port}", cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        node.server.close()
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "\x1b" not in text and "\x07" not in text
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("missing now")] == [lines[-1]], text
    assert lines[-1].startswith("missing now: 0\\x1b[31m (gpu-01)"), text
    assert "10.0.0.9:7070\\x1b]52;c;Y3VybCBldmlsfHNo\\x07\\nmissing now: none" in text


# ---------------------------------------------------------------- row 15: loopback
def test_crnetd_will_not_listen_on_loopback_without_a_secret_unless_insecure(tmp_path):
    got = crnetd(*MASTER_ARGS, "--client-socket", str(tmp_path / "m.sock"))
    assert got.returncode == 2, got.stderr
    assert "refusing to listen on 127.0.0.1:0 without --secret-file: every user of this host" \
        in got.stderr and "--insecure" in got.stderr and "Traceback" not in got.stderr
    got = crnetd(*MASTER_ARGS, "--insecure", "--check-config")
    assert got.returncode == 0, got.stderr
    secret = private_file(tmp_path / "secret")
    got = crnetd(*MASTER_ARGS, "--secret-file", str(secret), "--check-config")
    assert got.returncode == 0, got.stderr


def test_a_local_tree_without_a_secret_says_so(tmp_path):
    """LocalTree's daemons on 127.0.0.1 (tests, benchmarks) get --insecure when it gives
    them no secret; ``crnet demo`` and ``crnet run`` give theirs one."""
    open_tree = LocalTree(Tree((1,), (0,)), 4, workdir=tmp_path / "a")
    assert "--insecure" in open_tree.command(MASTER)
    closed = LocalTree(Tree((1,), (0,)), 4, workdir=tmp_path / "b", secret=True)
    assert "--insecure" not in closed.command(MASTER)
    assert "--secret-file" in closed.command(MASTER)


# ---------------------------------------------------------------- row 16: channel binding
class TlsRelay(PathProxy):
    """On the path, with a stolen certificate of the cluster: it ends the dialer's TLS
    connection and dials the node in a TLS connection of its own, passing every byte of
    the handshake (and, were it let through, of the link) between the two."""

    def __init__(self, certs: TlsFiles, upstream: int):
        accept, dial = contexts(certs)
        super().__init__("", accept, dial)
        self.upstream = upstream
        self.relayed = 0

    async def _down(self, reader, writer):   # both ways (PathProxy._up passes through here)
        while data := await reader.read(1 << 16):
            self.relayed += len(data)
            writer.write(data)
            await writer.drain()


def test_the_handshake_binds_the_tls_connection():
    a, b = os.urandom(32), os.urandom(32)
    plain = mac(b"k" * 32, "dialer", a, b, "child", "0")
    assert mac(b"k" * 32, "dialer", a, b, "child", "0", b"") == plain   # plain TCP: as before
    assert mac(b"k" * 32, "dialer", a, b, "child", "0", b"one") != mac(
        b"k" * 32, "dialer", a, b, "child", "0", b"two")
    assert channel_binding(None) == b""


@needs_openssl
async def test_a_relay_with_a_stolen_certificate_cannot_pass_the_handshake_on(local_tree, certs):
    lt = local_tree(Tree.regular(2, 1, 1), 4, secret=True, tls=certs)
    key = load_secret(lt.workdir / "secret")
    direct = await StatusClient.connect("127.0.0.1", lt.ports[MASTER], secret=key, tls=certs)
    direct.close()                    # the real path: admitted
    relay = await TlsRelay(certs, lt.ports[MASTER]).start()
    try:
        with pytest.raises(CrnetError, match="failed to authenticate"):
            through = await StatusClient.connect("127.0.0.1", relay.port, secret=key, tls=certs,
                                                 timeout=15)
            through.close()
    finally:
        await relay.close()
    assert relay.relayed > 0          # the relay did carry the handshake


# ---------------------------------------------------------------- row 17: credential files
@needs_root
def test_a_secret_of_another_user_is_refused(tmp_path):
    secret = private_file(tmp_path / "secret")
    os.chown(secret, NOBODY, -1)
    got = crnetd(*LEAF, "--secret-file", str(secret), "--check-config")
    assert got.returncode == 2 and "belongs to" in got.stderr and "uid 65534" in got.stderr, \
        got.stderr


def test_a_secret_in_a_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    secret = private_file(shared / "secret")
    shared.chmod(0o777)
    got = crnetd(*LEAF, "--secret-file", str(secret), "--check-config")
    assert got.returncode == 2, got.stdout + got.stderr
    assert f"{shared} (mode 777), which other users may write to" in got.stderr
    shared.chmod(0o1777)              # sticky, as /tmp: only the file's owner may replace it
    got = crnetd(*LEAF, "--secret-file", str(secret), "--check-config")
    assert got.returncode == 0, got.stderr
    os.symlink(secret, tmp_path / "link")
    shared.chmod(0o777)               # followed through a symbolic link: the same
    got = crnetd(*LEAF, "--secret-file", str(tmp_path / "link"), "--check-config")
    assert got.returncode == 2 and "which other users may write to" in got.stderr, got.stderr


@needs_openssl
def test_a_tls_key_others_may_read_is_refused(tmp_path, certs):
    key = tmp_path / "host.key"
    shutil.copy(certs.key, key)
    tls = ["--tls-cert", certs.cert, "--tls-key", str(key), "--tls-ca", certs.ca]
    for mode in (0o644, 0o604, 0o660):
        key.chmod(mode)
        got = crnetd(*LEAF, *tls, "--check-config")
        assert got.returncode == 2, (mode, got.stderr)
        assert "cannot load the TLS files" in got.stderr and f"(mode {mode:o})" in got.stderr
    key.chmod(0o600)
    got = crnetd(*LEAF, *tls, "--check-config")
    assert got.returncode == 0, got.stderr
    if os.geteuid() == 0:
        os.chown(key, NOBODY, -1)
        got = crnetd(*LEAF, *tls, "--check-config")
        assert got.returncode == 2 and "belongs to" in got.stderr, got.stderr
