"""Issue 26, point 2 in spread: a host's identity its parent cannot lend (``--tls-names``).

Where a spread host listens is its parent's word (JOINED's ``peers``). Real crnetd
processes on 127.0.0.1, each with a certificate of its own from one cluster CA naming its
``--host-id``; interior host 0 is broken: its daemon says that its child 0.0 listens
where a second process of host 0 (``tls_insider.TlsInsider``: the cluster secret, host 0's
own certificate and key) answers for 0.0's rank. Without ``--tls-names`` every host takes
that process for 0.0: it gets 0.0's share of the decoding and its forged sums reach the
other hosts' processes. With it, every host checks the certificate at the other end of a
peer link against the host id the master gave that rank (``crnet/node/peers/identity.py``).
The unit tests below check the rules themselves.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.errors import CrnetError, NotThatHost, ProtocolError
from crnet.node.neighbours import ChildSlot
from crnet.node.peers.identity import accepted_named, child_named, dialed_named, everyone
from crnet.protocol.auth import load_secret
from crnet.protocol.messages import Assign, Joined, PeerHello, parse
from crnet.protocol.tls import own_names
from crnet.protocol.wire import MsgType
from crnet.tools.launch import MASTER, crnet_argv, free_port

from ..helpers.certs import have_openssl, make_host_certs
from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients, rel_error
from ..helpers.waits import wait_for_log, wait_until
from .test_trust import running, step, write_secret
from .tls_insider import TlsInsider

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not have_openssl(), reason="needs the openssl command")]

TREE = Tree((2, 2), (1, 1))   # ranks: master 0, 0 1, 1 2, 0.0 3, 0.1 4, 1.0 5, 1.1 6
VICTIM = "0.0"                # its parent, host 0, is the broken host
RANK = TREE.rank(VICTIM)
DIM = 60000                   # 480 kB: each of the 7 hosts owns chunks (owners.MIN_SHARE_BYTES)
SAMPLES = 24


def host_id(name: str) -> str:
    return f"host-{name or 'master'}"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_host_certs(tmp_path_factory.mktemp("certs"), [host_id(n) for n in TREE.names()])


# Host 0's daemon, broken: it says its child 0.0 listens where its own second process does
# (and with LENT, that 0.0's host id is its own).
LIE = """
import crnet.node.peers.mesh as _mesh
_below = _mesh.Mesh.below
def _lie(tree, name, slots):
    found = dict(_below(tree, name, slots))
    if {victim!r} in found:
        found[{victim!r}] = "127.0.0.1:{port}"
    return tuple(sorted(found.items()))
_mesh.Mesh.below = staticmethod(_lie)
"""
LENT = """
import crnet.node.peers.identity as _identity
_hosts = _identity.below
def _lend(tree, name, slots):
    return tuple((n, {liar!r} if n == {victim!r} else h) for n, h in _hosts(tree, name, slots))
_identity.below = _lend
"""


def per_host(certs, liar_port: int, lend: bool = False):
    """LocalTree's ``spawn``: each daemon its own certificate and host id; host 0 lies."""
    def spawn(name, argv, kwargs):
        argv = list(argv)
        files = certs[host_id(name)]
        argv[argv.index("--tls-cert") + 1] = files.cert
        argv[argv.index("--tls-key") + 1] = files.key
        argv += ["--host-id", host_id(name)]
        if name == "0":
            lie = LIE.format(victim=VICTIM, port=liar_port)
            if lend:
                lie += LENT.format(victim=VICTIM, liar=host_id("0"))
            argv[2] = argv[2].replace("from crnet.cli import main", f"\n{lie}\nfrom crnet.cli import main")
        return subprocess.Popen(argv, **kwargs)
    return spawn


def exact_or_failed(outcome) -> bool:
    return isinstance(outcome, CrnetError) or rel_error(outcome, WANT) <= 1e-9


GRADS = gradients(26, SAMPLES, DIM)
WANT = GRADS.sum(axis=0)


@pytest.mark.asyncio(loop_factories=["asyncio"])
@pytest.mark.parametrize("names, lend", [(False, False), (True, False), (True, True)],
                         ids=["without-tls-names", "with-tls-names", "with-tls-names-and-its-own-host-id"])
async def test_an_interior_host_that_gives_its_own_address_for_its_child_answers_for_it(
        tmp_path, certs, names, lend):
    """Without --tls-names (the hole, as operations.md says it stays there): the hosts send
    0.0's share to host 0's second process, take its links as rank 0.0's, and its forged
    sums (666) become results. With it: no host's link to it passes the dialer's check, no
    link of its passes the acceptor's, it gets no piece; 0.0 is cut off from the peer links
    (its own links are taken by no host: none can reach 0.0 to confirm them) and the master,
    which found another host at 0.0's address, gives it no chunks: every process but 0.0's
    gets exact results at every step, and 0.0's steps fail (it straggles). If host 0 also says
    0.0's host id is its own (so that its certificate would pass), the master leaves 0.0
    out: no host dials it, and links that claim its rank are refused."""
    secret = write_secret(tmp_path)
    liar = await TlsInsider(load_secret(str(secret)), certs[host_id("0")], RANK).start()
    with running(tmp_path / "tree", TREE, SAMPLES, spawn=per_host(certs, liar.port, lend),
                 secret_file=str(secret), tls=certs[host_id(MASTER)], tls_names=names,
                 scheme="spread") as lt:
        clients = await connect_all(lt, list(TREE.names()), starting=True)
        try:
            hosts = [n for n in TREE.names() if n != VICTIM]
            liar.claim({TREE.rank(n): lt.ports[n] for n in hosts}, within=30)
            refused = (f"the master gave no host id for rank {RANK}" if lend else
                       f"its certificate does not name rank {RANK}'s host")
            for name in hosts:   # its claims are taken, or refused, before the first step
                rank = TREE.rank(name)
                if names:
                    await wait_until(lambda rank=rank: refused in liar.refused.get(rank, ""),
                                     f"{name} refused it")   # (its log says so, throttled)
                else:
                    await wait_until(lambda rank=rank: rank in liar.confirmed, f"{name} took it")
            if names:   # the master left 0.0 out, or found another host at its address
                await wait_for_log(lt, MASTER, f"from step 0 on, rank(s) {RANK} own no chunks (rank "
                                               f"{RANK} is not at the address the tree gave for it")
            outcomes = []
            for t in range(4):   # (each waits for 0.0's failure, at --timeout)
                outcomes.append(await step(clients, GRADS, t))
                for name, outcome in outcomes[-1].items():
                    if isinstance(outcome, CrnetError):
                        clients[name].mark_current()   # (its vectors depend on no parameters)
        finally:
            close_all(clients)
            await liar.close()
        forged = sum(isinstance(o, np.ndarray) and bool(np.any(o == 666.0))
                     for per in outcomes for o in per.values())
        if not names:   # the hole, which the master warned of when it started: the liar is
            # taken as 0.0 and sends forged chunks. (Whether one reaches a process depends on
            # the master: a host applies a step only on its SETTLED, issue 38; the hole
            # itself is issue 39's.)
            assert liar.pieces > 0 and liar.forged > 0, (liar.pieces, liar.forged, forged)
            await wait_for_log(lt, MASTER, "--scheme spread without --tls-names: in a spread tree "
                                           "a host that holds the cluster secret can answer for")
            return
        assert (liar.accepted, liar.pieces, liar.confirmed, forged) == (0, 0, set(), 0)
        assert all(exact_or_failed(o) for per in outcomes for o in per.values())
        assert all(rel_error(o, WANT) <= 1e-9 for per in outcomes for n, o in per.items() if n != VICTIM)
        if lend:
            await wait_for_log(lt, MASTER, f"spread: host {VICTIM} is said to have host id "
                                           f"'{host_id('0')}', that of 0 above it")
        for name in hosts:
            await wait_for_log(lt, name, f"the master left host {VICTIM} out of the peer links" if lend
                               else f"the host there is not rank {RANK}'s host '{host_id(VICTIM)}': its "
                                    f"certificate names '{host_id('0')}'")


# ------------------------------------------------------------------ the rules themselves

class Transport:
    """A TLS connection's transport as ``crnet.protocol.tls.names`` reads it: a peer certificate
    naming ``hosts`` (DNS subjectAltNames)."""

    def __init__(self, *hosts: str):
        cert = {"subjectAltName": tuple(("DNS", h) for h in hosts) + (("IP Address", "10.0.0.1"),)}
        self._ssl = SimpleNamespace(getpeercert=lambda: cert)

    def get_extra_info(self, name):
        return self._ssl if name == "ssl_object" else None


def test_a_peer_link_counts_only_where_the_certificate_names_the_ranks_host():
    hosts = ("m", "a", "b")
    assert accepted_named(Transport("a"), PeerHello(1, to=2), 2, hosts) is None
    assert accepted_named(Transport("x", "a"), PeerHello(1, to=2), 2, hosts) is None
    assert accepted_named(Transport("b"), PeerHello(1, to=2), 2, hosts) == \
        "its certificate does not name rank 1's host 'a'"
    assert accepted_named(Transport("a"), PeerHello(1, to=0), 2, hosts) == \
        "it says it dials rank 0, not this host's rank 2"
    assert accepted_named(Transport("a"), PeerHello(1), 2, hosts) == \
        "it says it dials rank None, not this host's rank 2"
    assert accepted_named(Transport("a"), PeerHello(1, to=2), 2, ("m", None, "b")) == \
        "the master gave no host id for rank 1: its peer links are not taken"
    assert accepted_named(None, PeerHello(1, to=2), 2, hosts) is not None   # plain TCP: no names
    dialed_named(Transport("b"), 2, "b")
    with pytest.raises(NotThatHost, match=r"^the host there is not rank 2's host 'b': its "
                                          r"certificate names 'a'$"):
        dialed_named(Transport("a"), 2, "b")
    with pytest.raises(NotThatHost, match="no host id for rank 2"):
        dialed_named(Transport("b"), 2, None)
    assert child_named(Transport("a"), "a") is None
    assert "does not name the host id its HELLO says ('b')" in child_named(Transport("a"), "b")
    assert "says no host id" in child_named(Transport("a"), None)


def test_own_names_reads_the_certificate_as_a_peer_sees_it(certs):
    assert own_names(certs[host_id("0.1")]) == (host_id("0.1"),)


def slots_of(*entries):
    """The master's child slots: (host id, {name below: host id})."""
    return [ChildSlot(host=host, address="10.0.0.1:1", hosts=below) for host, below in entries]


def test_a_rank_said_to_have_an_ancestors_host_id_is_left_out(caplog):
    """Host 0 says that 0.0 is host "a" (its own host id) and 0.1 "x": 0.0 is left out (0
    could answer for it with its own certificate). 1.0 is said to be "b": 1's own, left out
    too. 1.1 and 0.1 both said to be "x" (two hosts with one id, or a lie about one of them:
    the master cannot tell which) are kept and logged: only x's holder is taken as either,
    and it refuses links meant for a rank not its own."""
    slots = slots_of(("a", {"0.0": "a", "0.1": "x"}), ("b", {"1.0": "b", "1.1": "x"}))
    with caplog.at_level("ERROR", logger="crnet.node"):
        hosts = everyone(TREE, slots, "m")
    assert hosts == ("m", "a", "b", None, "x", None, "x")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("spread: host 0.0 is said to have host id 'a', that of 0 above it (a parent "
                        "lending its own identity): rank 3 is left out of the peer links, and the "
                        "subtree of 0 straggles")
    assert "rank 5 is left out" in lines[1]
    assert lines[-1].startswith("spread: host id 'x' is said of 2 hosts (0.1, 1.1)")
    assert everyone(TREE, slots_of(("a", {"0.0": "m"}), ("b", {})), "m")[3] is None   # the master's


def test_tls_names_without_tls_and_a_certificate_that_does_not_name_the_host_are_refused(
        tmp_path, certs):
    """crnetd exits 2 before it listens, saying what to change."""
    secret = write_secret(tmp_path)
    base = ["daemon", "--role", "master", "--listen", f"127.0.0.1:{free_port()}", "--samples", "4",
            "--fanout", "2", "--secret-file", str(secret), "--client-socket", str(tmp_path / "s")]
    files = certs[host_id("0")]
    tls = ["--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca]
    for extra, said in [
            (["--tls-names"], "--tls-names needs --tls-cert, --tls-key and --tls-ca"),
            ([*tls, "--tls-names", "--host-id", "host-1"],
             f"this host's certificate ({files.cert}) does not name its host id 'host-1' (it names "
             f"'{host_id('0')}'): give it a subjectAltName DNS:host-1, or start crnetd with the "
             "--host-id it names")]:
        done = subprocess.run(crnet_argv(*base, *extra), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done
        assert said in " ".join(done.stderr.split()), done.stderr


def test_host_ids_on_the_wire_are_bounded_and_checked():
    """JOINED's and ASSIGN's host ids are host ids (printable, no spaces, <= 64), PEER_HELLO's
    ``to`` a rank; a daemon from before them sends none (the fields are optional)."""
    joined = Joined(1, hosts=(("0.0", "host-0.0"),))
    assert parse(MsgType.JOINED, joined.header(), 0) == joined
    assert parse(MsgType.JOINED, {"workers": 1, "tree_step": -1}, 0).hosts == ()
    assign = Assign(4, None, ("a:1", None), ("m", None))
    assert parse(MsgType.ASSIGN, assign.header(), 8) == assign
    assert parse(MsgType.PEER_HELLO, PeerHello(1, to=2).header(), 0).to == 2
    for msg_type, header in [
            (MsgType.JOINED, {"workers": 1, "tree_step": -1, "hosts": [["0.0", "a b"]]}),
            (MsgType.JOINED, {"workers": 1, "tree_step": -1, "hosts": [["0.0", "x" * 65]]}),
            (MsgType.ASSIGN, {"samples": 4, "hosts": ["\x1b[2J"]}),
            (MsgType.PEER_HELLO, {"rank": 1, "to": -1})]:
        with pytest.raises(ProtocolError, match=r"hosts|to"):
            parse(msg_type, header, 8 if msg_type is MsgType.ASSIGN else 0)
