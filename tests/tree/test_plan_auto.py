"""crnetd --plan auto (issue 28): the second job of a script on the same daemons runs the plan
crnet tune's ranking chose from the first job's measurements, exact, with no manual step."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.errors import CrnetError
from crnet.tools.launch import MASTER
from crnet.tune.gather import gather

from ..helpers.clients import close_all, connect_all
from ..helpers.trees import workers
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, wait_until

pytestmark = pytest.mark.timeout(120)

TREE = Tree.regular(2, 2, 1)        # master; 0, 1; 0.0, 0.1, 1.0, 1.1: 7 daemons, 6 workers
TREE_S0 = Tree((2, 2), (0, 0))
SAMPLES = 24
PER_SAMPLE = 0.003                  # seconds each process computes (sleeps) per sample of its share


async def job(lt, name: str, grads: np.ndarray, steps: int, slow: float = 1.0) -> list[dict]:
    """Every worker's process of job ``name`` runs ``steps`` steps, computing PER_SAMPLE per
    sample of its share first (``slow`` x that in a third of its steps, drawn per (step,
    place): a ring then waits for such a straggler nearly every step); every result is the
    exact sum (with ``slow``, only under a scheme that waits for all: no process is left
    behind). Their assignments."""
    clients = list((await connect_all(lt, workers(lt.tree), timeout=60, job=name)).values())
    want = grads.sum(axis=0)

    async def run(c):
        load = sum(stop - start for start, stop, _ in c.assignment.ranges)
        for step in range(steps):
            draw = np.random.default_rng([step, sum(map(ord, c.assignment.name))]).random()
            await asyncio.sleep(PER_SAMPLE * load * (slow if draw < 1 / 3 else 1))
            got = await c.allreduce((step + 1) * local_gradient(c.assignment, grads), step=step)
            assert rel_error(got, (step + 1) * want) <= 1e-9, (name, step)
    try:
        await gather_or_cancel(*(run(c) for c in clients))
        return [{"name": c.assignment.name, "ranges": c.assignment.ranges} for c in clients]
    finally:
        close_all(clients)


def config_of(tree: dict) -> dict:
    return tree["measured"]["config"]


async def test_the_second_job_runs_the_tuned_plan(local_tree):
    """Started as cr with s = 1 at both layers: every worker computes 12 of the 24 samples.
    Every host's compute is the same fixed time per sample (no stragglers to wait out), so
    the ranking's best for these hosts in their places is s = 0 (the tree scheme, 4
    samples each); job b runs it, and every result of both jobs is exact."""
    lt = local_tree(TREE, SAMPLES, secret=True, plan="auto", tune_window=16)
    secret = (lt.workdir / "secret").read_bytes().strip()
    port = lt.ports[MASTER]
    grads = gradients(1, SAMPLES, 50)
    a = await job(lt, "a", grads, 20)
    assert all(sum(stop - start for start, stop, _ in x["ranges"]) == 12 for x in a)
    before = await gather("127.0.0.1", port, secret=secret)
    assert config_of(before)["scheme"] == "cr" and config_of(before)["stragglers"] == [1, 1]

    b = await job(lt, "b", grads, 10)
    # Job b's processes got the new plan's shares the normal way (their assignment)...
    assert all(sum(stop - start for start, stop, _ in x["ranges"]) == 4 for x in b)
    # ... and every node runs it.
    after = await gather("127.0.0.1", port, secret=secret)
    for entry in entries(after):
        got = config_of(entry) if entry["name"] == "" else entry["measured"]["config"]
        assert (got["scheme"], got["fanout"], got["stragglers"]) == ("tree", [2, 2], [0, 0]), entry["name"]
    said = lt.log_path(MASTER).read_text()
    assert "plan auto: job 'b': cr fanout 2,2, s 1,1" in said and "-> tree fanout 2,2" in said

    # crnet tune --write from the tuned tree: the plan it runs is the best for its hosts.
    tuned = lt.workdir / "tuned.toml"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crnet", "tune", f"127.0.0.1:{port}", "--secret-file",
        str(lt.workdir / "secret"), "--trials", "200", "--json", "--write", str(tuned),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["running"]["scheme"] == "tree"
    assert 'role = "master"' in tuned.read_text()


async def test_the_first_job_runs_the_configured_plan_and_a_fixed_master_never_replans(local_tree):
    lt = local_tree(TREE, SAMPLES, secret=True, tune_window=16)
    secret = (lt.workdir / "secret").read_bytes().strip()
    grads = gradients(2, SAMPLES, 20)
    for name in ("a", "b"):
        shares = await job(lt, name, grads, 8)
        assert all(sum(stop - start for start, stop, _ in x["ranges"]) == 12 for x in shares)
    tree = await gather("127.0.0.1", lt.ports[MASTER], secret=secret)
    assert config_of(tree)["stragglers"] == [1, 1]
    assert "plan auto" not in lt.log_path(MASTER).read_text()


def entries(entry):
    yield entry
    for child in entry["children"]:
        yield from entries(child)


async def test_a_master_restarted_with_other_stragglers_gives_the_nodes_its_plan(local_tree):
    """What crnet tune --write's advice relies on: the same shape with other stragglers
    needs only the master restarted; the nodes rejoin it and take its plan."""
    lt = local_tree(TREE, SAMPLES, secret=True)
    secret = (lt.workdir / "secret").read_bytes().strip()
    grads = gradients(3, SAMPLES, 20)
    a = await job(lt, "a", grads, 3)
    assert all(sum(stop - start for start, stop, _ in x["ranges"]) == 12 for x in a)
    lt.signal(MASTER, signal.SIGTERM)
    lt.procs[MASTER].wait(15)
    lt.tree = Tree((2, 2), (0, 0))
    lt.start_node(MASTER)
    lt.wait_sockets([MASTER], 30)

    async def replanned():
        try:
            tree = await gather("127.0.0.1", lt.ports[MASTER], secret=secret)
        except (OSError, CrnetError):
            return False
        return all(e["state"] == "joined" and ((e["measured"] or {}).get("config") or {}).get(
            "stragglers") == [0, 0] for e in entries(tree))
    await wait_until(replanned, "every node runs the restarted master's plan")
    b = await job(lt, "b", grads, 3)
    assert all(sum(stop - start for start, stop, _ in x["ranges"]) == 4 for x in b)


# ---------------------------------------------------------------- membership, fake links

def fake_place(name, tree=TREE, scheme="cr"):
    from crnet.schemes import Place

    return Place(name, tree.layer(name), tree, scheme, "auto", 64)


async def test_a_replan_reaches_each_child_as_welcome_then_assign_then_the_job(membership):
    """The master re-plans between jobs: each child link carries the new WELCOME, then the
    new ASSIGN, then the JOB; a node takes the new plan and passes both on the same way."""
    from crnet.coding.plan import plan
    from crnet.protocol.allocation import parse_allocation
    from crnet.protocol.messages import Assign, Hello, Job, Joined, Welcome

    from ..helpers.fake_links import FakeLink

    master = membership(fake_place(""), SAMPLES)
    links = [FakeLink(), FakeLink()]
    for link in links:
        master.child_hello(link, Hello())
    for k in range(2):
        master.child_joined(k, Joined(3))
    master.run_job("a")
    for link in links:
        link.sent.clear()
    flat = Tree((2, 2), (0, 0))
    master.replan(fake_place("", flat, "tree"))
    master.run_job("b")
    for k, link in enumerate(links):
        kinds = [type(m) for m, _ in link.sent]
        assert kinds == [Welcome, Assign, Job], kinds
        welcome, payload, job_msg = link.sent[0][0], link.sent[1][1], link.sent[2][0]
        assert (welcome.scheme, welcome.stragglers, welcome.job) == ("tree", (0, 0), "a")
        got = parse_allocation(payload, SAMPLES)
        want = plan(flat, SAMPLES).nodes[str(k)]
        assert got[str(k)].local == tuple(want.local) and job_msg.name == "b"
    assert master.engine.place == master.place and master.place.scheme == "tree"

    # A node of layer 1 with its two children: it takes the plan, passes WELCOME and ASSIGN on.
    node = membership()
    node.listen_address = "10.0.0.1:7000"
    node.welcomed(Welcome("0", 1, TREE.fanout, TREE.stragglers, "auto", 64, "cr"))
    kids = [FakeLink(), FakeLink()]
    for kid in kids:
        node.child_hello(kid, Hello())
        node.child_joined(node.neighbours.slots.index(
            next(s for s in node.neighbours.slots if s.link is kid)), Joined(1))
    old = plan(TREE, SAMPLES).nodes
    node.assigned(Assign(SAMPLES), memoryview(
        _pack({n: old[n] for n in old if n == "0" or n.startswith("0.")})))
    node.parent_job(Job("a"))
    for kid in kids:
        kid.sent.clear()
    node.welcomed(links[0].sent[0][0])
    node.assigned(links[0].sent[1][0], memoryview(links[0].sent[1][1]))
    node.parent_job(links[0].sent[2][0])
    assert node.place.scheme == "tree" and node.place.tree == flat and node.job == "b"
    for kid in kids:
        assert [type(m) for m, _ in kid.sent] == [Welcome, Assign, Job]
    # A WELCOME to a tree of another shape is still refused (the hosts would move).
    from crnet.errors import ProtocolError

    with pytest.raises(ProtocolError, match="differs from the one this node joined"):
        node.welcomed(Welcome("0", 1, (3,), (1,), "auto", 64, "cr"))


def _pack(nodes):
    from crnet.protocol.allocation import NodeShare, pack_allocation

    return pack_allocation({n: NodeShare(a.layer, tuple(a.local), tuple(a.responsibility))
                            for n, a in nodes.items()})


def test_a_node_takes_no_other_scheme_with_peers_in_its_place(membership):
    """rar's ring and spread's peers are made as hosts join: a WELCOME that moves a placed
    node to or from one is a ProtocolError (the link closes, the node dials again)."""
    from crnet.errors import ProtocolError
    from crnet.protocol.messages import Welcome

    node = membership()
    node.listen_address = "10.0.0.1:7000"
    node.welcomed(Welcome("0", 1, (2,), (0,), "auto", 64, "cr"))
    with pytest.raises(ProtocolError, match="scheme rar differs"):
        node.welcomed(Welcome("0", 1, (2,), (0,), "auto", 64, "rar"))
    node.welcomed(Welcome("0", 1, (2,), (0,), "auto", 64, "gc"))
    assert node.place.scheme == "gc"


async def test_a_process_of_the_running_job_back_during_the_gathering_keeps_its_plan(membership):
    """The master gathers and ranks before a new job starts; a process of the running job
    that attaches meanwhile keeps that job running, on its plan: nothing is re-planned."""
    from crnet.node.join.replan import AutoPlan
    from crnet.protocol.messages import Hello, Job, Joined
    from crnet.tune.tuning import TuneError

    from ..helpers.fake_links import FakeLink

    master = membership(fake_place(""), SAMPLES)
    for k in range(2):
        master.child_hello(FakeLink(), Hello())
        master.child_joined(k, Joined(3))
    master.run_job("a")
    for k in range(2):
        master.child_job(k, Job("a", 0))   # the children's processes, as they report them: none
    master.engine.learn(4)             # job a ran steps: job b is re-planned for
    back = object()

    class Status:
        asked = 0

        async def subtree(self, deadline, window):
            self.asked += 1
            if self.asked == 1:
                master.jobs.attached(back, "a")      # a process of job a, back meanwhile
            raise TuneError("nothing to fit")
    status = Status()
    AutoPlan(master, status, 16)
    master.jobs.ask("b")
    await asyncio.sleep(0.05)
    assert master.job == "a" and master.place == fake_place("", TREE)
    master.jobs.left(back)             # ... and once it is gone, job b starts (asked again)
    await wait_until(lambda: master.job == "b", "job b starts", timeout=5)
    assert status.asked == 2


async def test_a_move_reaches_every_host_then_each_joins_its_new_parent(membership):
    """The master moves the tree to a star (another fanout): each child link carries MOVE
    (every host's new name, new parent and listen address), then closes; the master waits
    for the star's six children. A node of layer 1 passes MOVE on with the master's address
    filled in, drops its children and parent, and dials its new parent as its new name."""
    from crnet.errors import JoinRefused
    from crnet.protocol.messages import Hello, Joined, Move

    from ..helpers.fake_links import FakeLink

    master = membership(fake_place(""), SAMPLES)
    links = [FakeLink("10.0.0.1:5000"), FakeLink("10.0.0.2:5000")]
    for k, link in enumerate(links):
        master.child_hello(link, Hello(listen=f"10.0.0.{k + 1}:7070"))
    # Each layer-1 node reports where its two children listen (JOINED's peers).
    for k in range(2):
        master.child_joined(k, Joined(3, peers=((f"{k}.0", f"10.0.{k}.10:7070"),
                                                (f"{k}.1", f"10.0.{k}.11:7070"))))
    master.run_job("a")
    star = fake_place("", Tree((6,), (1,)), "spread")
    assert master.move(star)
    for link in links:
        assert [type(m) for m, _ in link.sent][-1] is Move and link.closed
    table = {e[0]: e[1:] for e in links[0].sent[-1][0].moves}
    assert table["0.1"] == ("3", None, "10.0.0.11:7070")       # under the master now
    assert master.place == star and len(master.neighbours.slots) == 6
    assert master.allocation is None
    # A restarted host that dials its old parent is sent on to its place (here: the master
    # itself, which takes it as "3" whatever name it asks for).
    assert master.child_hello(FakeLink("10.0.0.11:5999"), Hello("0.1", "10.0.0.11:7070")) == 3

    # A node of layer 1 (was "0"; two children), told by the master to move.
    node = membership()
    node.listen_address = "10.0.0.1:7070"
    node.whereabouts.address = "10.9.9.9:7070"     # where it dials the master
    node.welcomed(links[0].sent[0][0])
    kids = [FakeLink(), FakeLink()]
    for kid in kids:
        node.child_hello(kid, Hello())
    parent = FakeLink()
    node.neighbours.parent = parent
    node.moved(links[0].sent[-1][0])
    passed = {e[0]: e[1:] for e in kids[0].sent[-1][0].moves}
    assert {to for _, to, _ in passed.values()} == {"10.9.9.9:7070"}   # the master, as it dials it
    assert all(kid.closed for kid in kids) and parent.closed
    assert node.place is None and node.parent_address == "10.9.9.9:7070"
    assert node._hello().name == table["0"][0]
    # Where it was a parent, a host that restarts is sent on to its place.
    node.welcomed(links[0].sent[0][0])
    with pytest.raises(JoinRefused) as refused:
        node.child_hello(FakeLink("10.0.1.10:6000"), Hello(None, "10.0.1.10:7070"))
    assert refused.value.retry and refused.value.to == ("10.9.9.9:7070", table["1.0"][0])


@pytest.mark.parametrize("scheme, tree", [("rar", Tree((6,), (0,))), ("spread", TREE_S0)],
                         ids=["rar", "spread-2-layers"])
async def test_the_second_job_moves_every_host_to_the_tuned_shape(local_tree, scheme, tree):
    """Started as rar or as spread without stragglers (each waits for every straggler):
    the ranking's best leaves stragglers out, so the master moves every host (their ring
    or peer links go; MOVE, and from two layers every host of layer 2 leaves its parent)
    and job b runs it, exact, on every node."""
    lt = local_tree(tree, SAMPLES, scheme=scheme, secret=True, plan="auto", tune_window=16)
    secret = (lt.workdir / "secret").read_bytes().strip()
    port = lt.ports[MASTER]
    grads = gradients(4, SAMPLES, 30)
    await job(lt, "a", grads, 20, slow=16)
    await job(lt, "b", grads, 10)    # (without stragglers: every process takes every step)
    said = lt.log_path(MASTER).read_text()
    assert f"plan auto: job 'b': {scheme} " in said, said[-3000:]
    assert "the tree takes another shape" in said
    after = await gather("127.0.0.1", port, secret=secret)
    want = config_of(after)
    assert (want["scheme"], want["fanout"], want["stragglers"]) != (
        scheme, list(tree.fanout), list(tree.stragglers))
    for entry in entries(after):
        got = entry["measured"]["config"]
        assert (got["scheme"], got["fanout"], got["stragglers"]) == (
            want["scheme"], want["fanout"], want["stragglers"]), entry["name"]
    assert sum(1 for _ in entries(after)) == 7


async def moved_tree(local_tree):
    """A spread tree of two layers, moved by --plan auto between jobs a and b (as above):
    the tree, its secret, the gradients and the configuration it runs after the move."""
    lt = local_tree(TREE_S0, SAMPLES, scheme="spread", secret=True, plan="auto", tune_window=16)
    secret = (lt.workdir / "secret").read_bytes().strip()
    grads = gradients(5, SAMPLES, 30)
    await job(lt, "a", grads, 20, slow=16)
    await job(lt, "b", grads, 3)
    want = config_of(await gather("127.0.0.1", lt.ports[MASTER], secret=secret))
    assert (want["scheme"], want["fanout"]) != ("spread", [2, 2])
    return lt, secret, grads, want


async def runs(lt, secret, config) -> bool:
    """Every daemon has joined and runs ``config`` (scheme, fanout, stragglers)."""
    try:
        tree = await gather("127.0.0.1", lt.ports[MASTER], secret=secret)
    except (OSError, CrnetError):
        return False
    found = list(entries(tree))
    return len(found) == 7 and all(
        e["state"] == "joined" and [((e["measured"] or {}).get("config") or {}).get(k)
                                    for k in ("scheme", "fanout", "stragglers")] == config
        for e in found)


async def test_a_moved_host_that_restarts_is_sent_on_to_its_new_place(local_tree):
    """After a move, host 0.0 restarts and dials its configured parent (host 0): host 0,
    which passed the MOVE on, sends it to its new parent (REFUSE with ``to``), it joins
    there, and job c runs on the moved tree, exact."""
    lt, secret, grads, want = await moved_tree(local_tree)
    config = [want["scheme"], want["fanout"], want["stragglers"]]
    lt.signal("0.0", signal.SIGTERM)
    lt.procs["0.0"].wait(15)
    lt.start_node("0.0")
    lt.wait_sockets(["0.0"], 30)
    await wait_until(lambda: runs(lt, secret, config), "the restarted host in its moved place")
    said = lt.log_path("0.0").read_text()
    assert "the tree moved this node: it joins" in said, said[-2000:]
    await job(lt, "c", grads, 3)


async def test_a_master_restarted_after_a_move_takes_every_host_back_to_its_configured_place(
        local_tree):
    """After a move, the master restarts with its configured plan (spread, 2,2): every host
    the move had placed elsewhere is refused there or offered another tree, joins its
    configured parent again, and job c runs on the configured tree, exact."""
    lt, secret, grads, _ = await moved_tree(local_tree)
    lt.signal(MASTER, signal.SIGTERM)
    lt.procs[MASTER].wait(15)
    lt.start_node(MASTER)
    lt.wait_sockets([MASTER], 30)
    await wait_until(lambda: runs(lt, secret, ["spread", [2, 2], [0, 0]]),
                     "every host back in its configured place", timeout=60)
    await job(lt, "c", grads, 3)
