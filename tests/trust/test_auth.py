"""Mutual authentication of the tree's links: the math (crnet.protocol.auth), the handshake against
real daemons, and who is refused before anything changes."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from crnet import AsyncClient
from crnet.coding.plan import Tree
from crnet.protocol.auth import load_secret, mac, new_nonce, verify
from crnet.protocol.messages import Challenge, Chunk, Hello, PeerHello, Proof, Refuse, Welcome

from ..helpers.clients import close_all, connect_all
from ..helpers.peers import RawPeer
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, wait_until

pytestmark = pytest.mark.timeout(120)

TREE = Tree.regular(2, 2, 1)


# ---------------------------------------------------------------- the math

def test_each_mac_binds_side_role_name_and_both_nonces():
    secret, a, b = b"s" * 32, new_nonce(), new_nonce()
    base = mac(secret, "dialer", a, b, "child", "0.1")
    assert len(base) == 32 and verify(base, mac(secret, "dialer", a, b, "child", "0.1"))
    for other in (mac(b"t" * 32, "dialer", a, b, "child", "0.1"),
                  mac(secret, "acceptor", a, b, "child", "0.1"),
                  mac(secret, "dialer", b, a, "child", "0.1"),
                  mac(secret, "dialer", a, b, "ring", "0.1"),
                  mac(secret, "dialer", a, b, "child", "0.2")):
        assert not verify(base, other)


def test_a_secret_file_must_be_long_enough_and_private(tmp_path):
    path = tmp_path / "secret"
    path.write_text("short\n")
    path.chmod(0o600)
    with pytest.raises(ValueError, match="at least 16"):
        load_secret(path)
    path.write_text("0123456789abcdef0123\n")
    assert load_secret(path) == b"0123456789abcdef0123"
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable or writable by other users"):
        load_secret(path)


# ---------------------------------------------------------------- live daemons

def master_port(lt):
    return lt.ports[""]


def the_secret(lt) -> bytes:
    return load_secret(lt.workdir / "secret")


async def master_after_assignment(lt):
    """The master's client, once the whole tree has joined and been assigned its shares
    (each daemon's process connected once)."""
    clients = list((await connect_all(lt, lt.procs)).values())
    for c in clients[1:]:
        c.close()
    return clients[0]


async def children_up(master):
    return (await master.stats())["links"]["children"]


async def one_exact_step(lt, grads):
    """Every daemon's process contributes to step 0; every result is the exact sum."""
    clients = await connect_all(lt, lt.procs)
    try:
        for r in await gather_or_cancel(*(c.allreduce(local_gradient(c.assignment, grads), step=0)
                                          for c in clients.values())):
            assert rel_error(r, grads.sum(axis=0)) <= 1e-9
    finally:
        close_all(clients)


async def test_a_tree_with_a_secret_runs_exact_steps(local_tree):
    lt = local_tree(TREE, 14, secret=True)
    grads = gradients(0, 14, 5)
    await one_exact_step(lt, grads)
    assert "authenticated" in lt.log_path("").read_text()


async def test_a_ring_with_a_secret_runs_exact_steps(local_tree):
    ring = Tree((4,), (0,))
    lt = local_tree(ring, 8, scheme="rar", secret=True)
    grads = gradients(1, 8, 3)   # 3 < 4 workers: empty segments
    await one_exact_step(lt, grads)


async def test_a_peer_without_the_handshake_is_refused_before_it_takes_a_slot(local_tree):
    lt = local_tree(Tree.regular(2, 1, 1), 4, secret=True)
    master = await master_after_assignment(lt)
    lt.signal("1", signal.SIGKILL)                       # slot 1 is free now
    await wait_until(lambda: _child_down(master, 1), "slot 1 to be free")
    peer = await RawPeer.to(master_port(lt))
    peer.send(Hello("1", None))                          # no nonce: no authentication
    refused = await peer.next()
    assert isinstance(refused, Refuse) and "requires authentication" in refused.reason
    assert await peer.closed()
    assert await children_up(master) == [True, False]
    peer = await RawPeer.to(master_port(lt))
    peer.send(Chunk(0, 0, 4, "float32"), b"\0" * 16)     # anything else first: cut off
    assert await peer.closed()
    master.close()


async def _child_down(master, k):
    return not (await children_up(master))[k]


async def test_a_wrong_secret_and_a_replayed_proof_are_refused(local_tree):
    lt = local_tree(Tree.regular(2, 1, 1), 4, secret=True)
    master = await master_after_assignment(lt)
    lt.signal("1", signal.SIGKILL)
    await wait_until(lambda: _child_down(master, 1), "slot 1 to be free")
    secret, ours = the_secret(lt), new_nonce()
    # The daemon proves itself first: a dialer without the secret learns nothing it can use.
    wrong = await RawPeer.to(master_port(lt))
    wrong.send(Hello("1", None, ours))
    challenge = await wrong.next()
    assert isinstance(challenge, Challenge)
    assert verify(mac(secret, "acceptor", ours, challenge.nonce, "child", "1"), challenge.mac)
    wrong.send(Proof(mac(b"not the cluster's secret", "dialer", ours, challenge.nonce, "child", "1")))
    refused = await wrong.next()
    assert isinstance(refused, Refuse) and "authentication failed" in refused.reason
    # A proof that was right on one connection is useless on the next: the daemon's
    # nonce differs.
    first = await RawPeer.to(master_port(lt))
    first.send(Hello("1", None, ours))
    c1 = await first.next()
    recorded = Proof(mac(secret, "dialer", ours, c1.nonce, "child", "1"))
    first.close()
    replay = await RawPeer.to(master_port(lt))
    replay.send(Hello("1", None, ours))
    c2 = await replay.next()
    assert c2.nonce != c1.nonce
    replay.send(recorded)
    refused = await replay.next()
    assert isinstance(refused, Refuse) and "authentication failed" in refused.reason
    # A proof for one name does not admit another.
    other = await RawPeer.to(master_port(lt))
    other.send(Hello("1", None, ours))
    c3 = await other.next()
    other.send(Proof(mac(secret, "dialer", ours, c3.nonce, "child", "0")))
    assert isinstance(await other.next(), Refuse)
    assert await children_up(master) == [True, False]
    # With the secret, the handshake admits it: the slot is taken.
    good = await RawPeer.to(master_port(lt))
    good.send(Hello("1", None, ours))
    c4 = await good.next()
    good.send(Proof(mac(secret, "dialer", ours, c4.nonce, "child", "1")))
    assert isinstance(await good.next(), Welcome)
    assert await children_up(master) == [True, True]
    good.close()
    master.close()


async def test_a_ring_predecessor_must_authenticate_too(local_tree):
    lt = local_tree(Tree((3,), (0,)), 6, scheme="rar", secret=True)
    port = lt.ports["1"]
    peer = await RawPeer.to(port)
    peer.send(PeerHello(0))
    refused = await peer.next()
    assert isinstance(refused, Refuse) and "requires authentication" in refused.reason


async def test_a_node_with_the_secret_reclaims_its_slot_from_a_dead_connection_at_once(local_tree):
    """The old connection is still open (its daemon is frozen, not dead to the kernel):
    the restarted node, authenticated, takes the slot back without waiting for it."""
    lt = local_tree(TREE, 14, secret=True)
    (await master_after_assignment(lt)).close()        # 0.1 holds its slot
    lt.signal("0.1", signal.SIGSTOP)
    old = lt.procs["0.1"]
    lt.procs["0.1"] = lt.start_node("0.1")               # the same --name, the same secret
    try:
        await wait_until(lambda: _joined(lt, "0.1"), "the restarted node to join", timeout=20)
    finally:
        old.send_signal(signal.SIGKILL)
        old.wait()
    grads = np.ones((14, 2))
    await one_exact_step(lt, grads)
    assert "closing its old connection" in lt.log_path("0").read_text()


async def _joined(lt, name):
    try:
        async with await AsyncClient.connect(lt.socket_path(name), timeout=1) as c:
            return (await c.stats())["state"] == "assigned"
    except Exception:   # noqa: BLE001 -- not up yet
        return False


def crnetd(*args, env=None):
    return subprocess.run([sys.executable, "-m", "crnet", "daemon", *args], capture_output=True,
                          text=True, timeout=30, env=env)


def test_crnetd_will_not_listen_beyond_loopback_without_a_secret(tmp_path):
    got = crnetd("--role", "master", "--listen", "0.0.0.0:0", "--samples", "4", "--fanout", "2",
                 "--layers", "1", "--stragglers", "1")
    assert got.returncode == 2 and "refusing to listen on 0.0.0.0 without --secret-file" in got.stderr
    assert "Traceback" not in got.stderr
    loose = tmp_path / "secret"
    loose.write_text("x" * 40)
    loose.chmod(0o644)
    got = crnetd("--role", "node", "--parent", "127.0.0.1:1", "--secret-file", str(loose))
    assert got.returncode == 2 and "chmod 600" in got.stderr
    env = dict(os.environ, CRNET_SECRET_FILE=str(tmp_path / "missing"))
    got = crnetd("--role", "node", "--parent", "127.0.0.1:1", env=env)
    assert got.returncode == 2 and "missing" in got.stderr


class Recorder:
    """A link behind a guard: what reaches it (and, for a dialed link, why it was rejected)."""

    def __init__(self):
        self.got = []

    def payload_dest(self, conn, msg, nbytes):
        return memoryview(bytearray(nbytes))

    def received(self, conn, msg, payload):
        self.got.append(msg)

    def lost(self, conn, exc):
        self.got.append("lost")

    def reject(self, conn, reason):
        self.got.append(("rejected", reason))
        conn.close()


def dialing(secret=b"s" * 32):
    from crnet.protocol.handshake import Dialing

    from ..helpers.fake_links import FakeLink

    link, conn = Recorder(), FakeLink("parent 10.0.0.1:7070")
    guard = Dialing(link, secret)
    hello = guard.hello(Hello("0", None))
    return link, conn, guard, hello


def test_a_dialer_with_a_secret_drops_a_peer_that_welcomes_it_unchallenged():
    """Not a refusal (that would stop the node for good, exit 2): the link is no good,
    and the node dials again (dial.py)."""
    link, conn, guard, hello = dialing()
    assert hello.nonce is not None
    guard.received(conn, Welcome("0", 1, (2,), (1,), "auto", 4096, "cr"), None)
    assert link.got == [("rejected", "parent 10.0.0.1:7070 answered WELCOME without "
                                     "authenticating itself: it does not hold this cluster's "
                                     "secret")]
    assert conn.closed and not conn.authenticated


def test_a_dialer_with_a_secret_takes_no_refusal_from_a_peer_that_did_not_authenticate():
    link, conn, guard, _ = dialing()
    guard.received(conn, Refuse("master has all 2 child slots taken\nFORGED", False), None)
    assert link.got == [("rejected", "parent 10.0.0.1:7070 refused this node before "
                                     "authenticating itself: 'master has all 2 child slots "
                                     "taken\\nFORGED'")]
    assert conn.closed


def test_a_dialer_drops_a_peer_whose_challenge_is_wrong_and_hears_one_that_proved_itself():
    secret = b"s" * 32
    link, conn, guard, hello = dialing(secret)
    theirs = new_nonce()
    guard.received(conn, Challenge(theirs, mac(b"t" * 32, "acceptor", hello.nonce, theirs,
                                                "child", "0")), None)
    [(what, reason)] = link.got
    assert what == "rejected" and "failed to authenticate" in reason
    assert conn.messages() == [] and not conn.authenticated      # no proof given to it

    link, conn, guard, hello = dialing(secret)
    guard.received(conn, Challenge(theirs, mac(secret, "acceptor", hello.nonce, theirs,
                                                "child", "0")), None)
    assert isinstance(conn.messages()[0], Proof) and conn.authenticated
    refusal = Refuse("master has all 2 child slots taken", False)
    guard.received(conn, refusal, None)       # an authenticated parent's word: for the link
    assert link.got == [refusal]


def test_without_a_secret_a_refusal_goes_to_the_link():
    link, conn, guard, _ = dialing(None)
    refusal = Refuse("master has all 2 child slots taken", False)
    guard.received(conn, refusal, None)
    assert link.got == [refusal] and not conn.closed


def test_an_acceptor_passes_nothing_on_before_the_proof():
    from crnet.node.admission.guard import Accepting, Doorway
    from crnet.protocol.wire import Limits

    from ..helpers.fake_links import FakeLink

    link, conn = Recorder(), FakeLink("child")
    guard = Accepting(link, b"s" * 32, Doorway(), Limits)
    guard.received(conn, Hello("0", None, new_nonce()), None)
    assert isinstance(conn.messages()[0], Challenge)
    with pytest.raises(Exception, match="before the handshake's PROOF"):
        guard.received(conn, Hello("0", None, new_nonce()), None)
    with pytest.raises(Exception, match="payload before authentication"):
        guard.payload_dest(conn, Chunk(0, 0, 1, "float32"), 4)
    guard.lost(conn, None)
    assert link.got == []


def test_an_acceptor_logs_a_peer_that_hangs_up_after_the_challenge(caplog):
    """A node with another secret finds the master's challenge wrong and hangs up before its
    PROOF: the master's log says so (the README: refused "and logged"), once per address."""
    from crnet.node.admission.guard import Accepting, Doorway, log
    from crnet.peer_text import Throttle
    from crnet.protocol.wire import Limits

    from ..helpers.fake_links import FakeLink

    warnings = Throttle(log)   # the node's, shared by its connections
    with caplog.at_level("WARNING", logger="crnet.node"):
        for _ in range(3):
            link, conn = Recorder(), FakeLink("10.0.0.9:40000")
            guard = Accepting(link, b"s" * 32, Doorway(), Limits, warnings)
            guard.received(conn, Hello("0", None, new_nonce()), None)
            guard.lost(conn, None)
            assert link.got == []
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "10.0.0.9:40000" in said[0] and "secret" in said[0], said


def test_a_daemon_with_another_secret_is_logged_at_the_master(local_tree, tmp_path):
    """The README: such a peer is refused "and logged"; the master's log had nothing."""
    import time

    lt = local_tree(Tree((1,), (0,)), 4, secret=True)
    other = tmp_path / "other-secret"
    other.write_text(os.urandom(32).hex())
    other.chmod(0o600)
    node = subprocess.Popen([sys.executable, "-m", "crnet", "daemon", "--role", "node",
                             "--parent", f"127.0.0.1:{master_port(lt)}", "--secret-file",
                             str(other), "--client-socket", str(tmp_path / "other.sock")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while "hung up after the challenge" not in lt.log_path("").read_text():
            assert time.monotonic() < deadline, lt.log_path("").read_text()
            time.sleep(0.1)
    finally:
        node.kill()
        node.wait(30)
    assert "another --secret-file" in lt.log_path("").read_text()
