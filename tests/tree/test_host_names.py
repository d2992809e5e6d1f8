"""Stable host names: a node without --name is given the slot its host id held before."""

import subprocess

import pytest

from crnet.coding.plan import Tree
from crnet.errors import ProtocolError
from crnet.protocol.auth import mac
from crnet.protocol.fields import check_host_id
from crnet.protocol.handshake import claim
from crnet.protocol.messages import Hello, parse
from crnet.protocol.wire import MsgType
from crnet.schemes import Place
from crnet.tools.launch import MASTER
from crnet.tools.status import StatusClient, rows

from ..helpers.fake_links import FakeLink
from ..helpers.trees import KILL
from ..helpers.waits import wait_for_log, wait_until

pytestmark = pytest.mark.timeout(120)

TREE = Tree.regular(3, 1, 1)     # master -> 0, 1, 2


@pytest.fixture
def master(membership):
    return membership(Place("", 0, TREE, "cr", "auto", 32), 30)


def test_a_host_gets_its_slot_back_and_new_hosts_take_unclaimed_ones(master):
    a, b = FakeLink("10.0.0.1:1"), FakeLink("10.0.0.2:1")
    assert master.child_hello(a, Hello(host="host-a")) == 0
    assert master.child_hello(b, Hello(host="host-b")) == 1
    master.child_lost(0, a)
    # A new host does not take host-a's slot while another is free.
    assert master.child_hello(FakeLink("10.0.0.3:1"), Hello(host="host-c")) == 2
    # host-a comes back (restarted, no --name): its slot, and its slot's share.
    assert master.child_hello(FakeLink("10.0.0.1:2"), Hello(host="host-a")) == 0
    assert master.hosts == {"host-a": 0, "host-b": 1, "host-c": 2}
    assert [s.host for s in master.neighbours.slots] == ["host-a", "host-b", "host-c"]


def test_a_second_node_with_the_same_host_id_gets_another_slot(master, caplog):
    first = FakeLink("10.0.0.1:1")
    assert master.child_hello(first, Hello(host="same")) == 0
    assert master.child_hello(FakeLink("10.0.0.1:2"), Hello(host="same")) == 1
    assert "holds child slot 0 from 10.0.0.1:1" in caplog.text
    assert "give each its own --host-id" in caplog.text
    assert master.hosts == {"same": 0}            # the host id keeps its first slot


def test_an_explicit_name_wins_and_moves_the_host_id(master):
    assert master.child_hello(FakeLink(), Hello(host="h")) == 0
    master.child_lost(0, master.neighbours.slots[0].link)
    assert master.child_hello(FakeLink(), Hello("2", host="h")) == 2
    assert master.hosts == {"h": 2}


def test_host_ids_are_validated_and_bound_into_the_handshake():
    assert check_host_id("gpu-07.rack3") is None
    assert "printable" in check_host_id("two words")
    assert "1..64" in check_host_id("x" * 65)
    with pytest.raises(ProtocolError, match="host"):
        parse(MsgType.HELLO, {"name": None, "listen": None, "nonce": None, "host": "a\nb"}, 0)
    with pytest.raises(ProtocolError, match="host"):
        parse(MsgType.HELLO, {"name": None, "listen": None, "nonce": None, "host": "x" * 65}, 0)
    # A proof made for one host id does not admit another.
    key, nonces = b"k" * 32, (b"a" * 32, b"b" * 32)
    one = mac(key, "dialer", *nonces, *claim(Hello(host="host-a")))
    other = mac(key, "dialer", *nonces, *claim(Hello(host="host-b")))
    assert one != other != mac(key, "dialer", *nonces, *claim(Hello()))


async def test_a_restarted_node_without_name_gets_its_old_slot(local_tree):
    """Workers start without --name, each with its own --host-id; the one that held slot 1
    is killed and restarted: it joins as 1 again."""
    def spawn(name, argv, kwargs):
        if "--name" in argv:
            i = argv.index("--name")
            argv = [*argv[:i], *argv[i + 2:], "--host-id", f"host-{name}"]
        return subprocess.Popen(argv, **kwargs)

    lt = local_tree(TREE, 30, spawn=spawn)

    async def slots():
        client = await StatusClient.connect("127.0.0.1", lt.ports[MASTER])
        client.close()
        table = {r.name: r for r in rows(client.first)}
        if all(table[s].state == "joined" for s in ("0", "1", "2")):
            return {s: table[s].host for s in ("0", "1", "2")}
        return None
    before = await wait_until(slots, "every worker joined")
    assert sorted(before.values()) == ["host-0", "host-1", "host-2"]
    daemon = before["1"].removeprefix("host-")      # the LocalTree name of slot 1's daemon
    lt.signal(daemon, KILL)
    await wait_for_log(lt, MASTER, "child 1 disconnected")
    lt.start_node(daemon)
    await wait_until(lambda: lt.log_path(MASTER).read_text().count("child 1 joined from") == 2,
                     "slot 1 taken again")
    assert lt.log_path(daemon).read_text().count("joined as 1 (") == 2
    after = await wait_until(slots, "every worker joined again")
    assert after == before
