"""crnet status: the tree as the master (or any node) sees it, through the tree's authentication."""

import asyncio
import json
import socket

import numpy as np
import pytest
from click.testing import CliRunner

from crnet.cli import main
from crnet.coding.plan import Tree
from crnet.errors import CrnetError, ProtocolError
from crnet.node.observe.status import check_subtree
from crnet.protocol.messages import StatusReply, parse
from crnet.protocol.wire import MsgType
from crnet.tools.launch import MASTER
from crnet.tools.status import StatusClient, missing, rows

from ..helpers.clients import close_all, connect_all
from ..helpers.trees import KILL
from ..helpers.vectors import local_gradient
from ..helpers.waits import wait_until

pytestmark = pytest.mark.timeout(120)

TREE = Tree.regular(2, 2, 1)        # master; 0, 1; 0.0, 0.1, 1.0, 1.1


async def ask(lt, name=MASTER, secret=True):
    key = (lt.workdir / "secret").read_bytes().strip() if secret else None
    client = await StatusClient.connect("127.0.0.1", lt.ports[name], secret=key)
    client.close()
    return client.first


async def all_joined(lt, secret=True):
    """Wait until the master shows every node joined (the daemons are up before that)."""
    async def check():
        tree = await ask(lt, secret=secret)
        return tree if all(r.state == "joined" for r in rows(tree)) else None
    return await wait_until(check, "every node joined")


async def test_the_master_shows_every_node_and_who_is_missing(local_tree):
    lt = local_tree(TREE, 12, secret=True)
    grads = np.ones((12, 3))
    workers = [n for n in TREE.names() if n]
    clients = list((await connect_all(lt, workers)).values())
    try:
        for step in range(3):
            await asyncio.gather(*(c.allreduce(local_gradient(c.assignment, grads), step=step)
                                   for c in clients))
    finally:
        close_all(clients)
    tree = await ask(lt)
    table = {r.name: r for r in rows(tree)}
    assert list(table) == ["master", "0", "0.0", "0.1", "1", "1.0", "1.1"]
    host = socket.gethostname()
    for name, r in table.items():
        assert r.state == "joined" and r.tree_step == 2, (name, r)
        assert r.host == host and r.last_step_seconds is not None
        if name != "master":   # of the steps decoded at its parent (the master: every one)
            assert 0 <= r.straggled <= r.recent <= 3
        if name in ("0", "1"):
            assert r.recent == 3
    assert table["0"].address == f"127.0.0.1:{lt.ports['0']}"    # where it listens
    assert table["0.1"].address.startswith("127.0.0.1:")           # where it connected from
    assert missing(tree) == []
    # A leaf dies and a layer-1 node dies: the master sees both missing, and the nodes under
    # the dead one unreachable; the host ids stay with the slots.
    lt.signal("1.1", KILL)
    lt.signal("0", KILL)

    async def both_gone():
        t = await ask(lt)
        return t if {r.name for r in missing(t)} == {"0", "1.1"} else None
    tree = await wait_until(both_gone, "0 and 1.1 missing at the master")
    table = {r.name: r for r in rows(tree)}
    assert table["0"].host == host and table["1.1"].host == host
    assert table["0.0"].state == table["0.1"].state == "unreachable"
    assert table["1"].state == "joined" and table["1.0"].state == "joined"
    # Asked directly, a node that lost its parent says it is reconnecting; node 1 shows
    # only its subtree.
    assert (await ask(lt, "1"))["name"] == "1"
    assert [r.name for r in rows(await ask(lt, "1"))] == ["1", "1.0", "1.1"]


async def test_status_needs_the_secret(local_tree, tmp_path):
    lt = local_tree(Tree.regular(1, 1, 0), 2, secret=True)
    with pytest.raises(CrnetError, match="requires authentication"):
        await ask(lt, secret=False)
    wrong = b"w" * 32
    with pytest.raises(CrnetError, match="failed to authenticate"):
        await StatusClient.connect("127.0.0.1", lt.ports[MASTER], secret=wrong)
    assert (await all_joined(lt))["state"] == "joined"


async def test_a_node_without_a_secret_is_asked_without_one_on_loopback(local_tree):
    lt = local_tree(Tree.regular(2, 1, 1), 4)
    tree = await all_joined(lt, secret=False)
    assert [r.name for r in rows(tree)] == ["master", "0", "1"]
    # --watch asks again on the same connection.
    client = await StatusClient.connect("127.0.0.1", lt.ports[MASTER])
    try:
        again = await client.refresh()
        assert [r.state for r in rows(again)] == ["joined"] * 3
    finally:
        client.close()


def test_the_cli_prints_a_table_and_json(local_tree):
    lt = local_tree(Tree.regular(2, 1, 1), 4)
    asyncio.run(all_joined(lt, secret=False))
    address = f"127.0.0.1:{lt.ports[MASTER]}"
    out = CliRunner().invoke(main, ["status", address])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0].split()[:4] == ["NODE", "HOST", "ADDRESS", "STATE"]
    assert out.output.rstrip().endswith("missing now: none")
    doc = json.loads(CliRunner().invoke(main, ["status", address, "--json"]).output)
    assert [c["name"] for c in doc["children"]] == ["0", "1"]
    bad = CliRunner().invoke(main, ["status", "127.0.0.1:1"])
    assert bad.exit_code == 1 and "127.0.0.1:1" in bad.output


def entry(name, children=(), **fields):
    return {"name": name, "host": None, "address": None, "state": "joined", "tree_step": 0,
            "steps_done": 0, "last_step_seconds": None, "straggled": None, "recent": None,
            "children": list(children), **fields}


def test_a_childs_answer_is_bounded_by_its_subtree():
    tree = TREE
    check_subtree(tree, "0", entry("0", [entry("0.0"), entry("0.1")]))
    with pytest.raises(ProtocolError, match="answered as"):
        check_subtree(tree, "0", entry("1"))
    with pytest.raises(ProtocolError, match="names children"):
        check_subtree(tree, "0", entry("0", [entry("1.0")]))
    with pytest.raises(ProtocolError, match="names children"):
        check_subtree(tree, "0", entry("0", [entry("0.0"), entry("0.0")]))
    header = {"id": 1, "node": entry("0", host="bad host")}
    with pytest.raises(ProtocolError, match="host"):
        parse(MsgType.STATUS_REPLY, header, 0)
    with pytest.raises(ProtocolError, match="state"):
        parse(MsgType.STATUS_REPLY, {"id": 1, "node": entry("0", state="fine")}, 0)
    deep = entry("x")
    for _ in range(20):
        deep = entry("x", [deep])
    with pytest.raises(ProtocolError, match="16 layers"):
        parse(MsgType.STATUS_REPLY, {"id": 1, "node": deep}, 0)
    ok = parse(MsgType.STATUS_REPLY, {"id": 1, "node": entry("0", host="h-1")}, 0)
    assert isinstance(ok, StatusReply) and ok.node["host"] == "h-1"
