"""crnet tune on a real tree: every daemon's windows gathered through crnet status's
authenticated connection, bounded; the fit and the ranking from them; the CLI's errors."""

from __future__ import annotations

import asyncio
import json
import sys

import msgpack
import numpy as np
import pytest
from click.testing import CliRunner

from crnet.cli import main
from crnet.coding.plan import Tree
from crnet.errors import CrnetError
from crnet.protocol.wire import PREFIX, MsgType, encode
from crnet.tools.launch import MASTER
from crnet.tools.status import rows
from crnet.tune.gather import gather
from crnet.tune.model import candidates
from crnet.tune.tuning import measurements, tune

from ..helpers.clients import close_all, connect_all
from ..helpers.trees import workers
from ..helpers.vectors import local_gradient

pytestmark = pytest.mark.timeout(120)

TREE = Tree.regular(2, 2, 1)        # master; 0, 1; 0.0, 0.1, 1.0, 1.1
STEPS = 12
PER_SAMPLE = 0.002                  # seconds each process sleeps per sample of its share


async def train(lt, steps=STEPS):
    """Every worker's process runs ``steps`` steps, computing (sleeping) PER_SAMPLE per
    sample of its share first."""
    grads = np.ones((24, 100))
    clients = list((await connect_all(lt, workers(TREE))).values())

    async def run(c):
        load = sum(stop - start for start, stop, _ in c.assignment.ranges)
        for step in range(steps):
            await asyncio.sleep(PER_SAMPLE * load)
            await c.allreduce(local_gradient(c.assignment, grads), step=step)
    try:
        await asyncio.gather(*(run(c) for c in clients))
    finally:
        close_all(clients)


def secret_of(lt) -> bytes:
    return (lt.workdir / "secret").read_bytes().strip()


async def test_tune_gathers_every_hosts_window_from_a_real_tree(local_tree):
    lt = local_tree(TREE, 24, secret=True, tune_window=8)
    await train(lt)
    port = lt.ports[MASTER]
    with pytest.raises(CrnetError, match="requires authentication"):
        await gather("127.0.0.1", port)
    tree = await gather("127.0.0.1", port, secret=secret_of(lt))
    nodes = {r.name: r for r in rows(tree)}
    assert set(nodes) == {"master", "0", "1", "0.0", "0.1", "1.0", "1.1"}

    def entries(entry):
        yield entry
        for child in entry["children"]:
            yield from entries(child)
    by_name = {e["name"] or "master": e["measured"] for e in entries(tree)}
    for name, m in by_name.items():
        assert m is not None and m["window"] == 8, name
        assert m["config"]["fanout"] == [2, 2] and m["config"]["vector_bytes"] == 800
        if name == "master":
            assert m["local_samples"] == 0 and m["compute"] == []
            continue
        (c,) = m["compute"]
        # Steps 1..11 measured (the first has no answer before it), the newest 8 kept; each
        # at least the sleep (give or take uvloop's clock, cached once per loop turn: a
        # sleep begun late in a busy turn ends early).
        assert c["steps"] == list(range(STEPS - 8, STEPS)), name
        assert min(c["micros"]) >= 1e6 * PER_SAMPLE * m["local_samples"] * 0.7, name
    master = by_name["master"]
    assert 1 <= len(master["periods"]["steps"]) <= 8
    assert master["arrivals"] and all(len(a["steps"]) <= 8 for a in master["arrivals"])
    assert [x["peer"] for x in master["links"]] == ["0", "1"]
    if sys.platform == "linux":   # TCP_INFO
        assert all(x["min_rtt_us"] is not None and x["rate"] for x in master["links"])
        assert all(x["link"] == "parent" for x in by_name["0.0"]["links"])
    # Bounded: the asker says how many steps of each window it wants.
    few = await gather("127.0.0.1", port, secret=secret_of(lt), window=3)
    assert all(len(c["steps"]) <= 3 for e in entries(few) if e["measured"]
               for c in e["measured"]["compute"] + e["measured"]["arrivals"])

    t = tune(measurements(tree), trials=200)
    assert len(t.ranking) == len(candidates(TREE.workers))
    assert t.running.scheme == "cr" and t.running.tree == TREE
    assert t.running_rank is not None and t.measured_mean is not None
    assert set(t.hosts) == {"0", "1", "0.0", "0.1", "1.0", "1.1"}
    # Every host sleeps PER_SAMPLE per sample; the time to its SUBMIT adds a little (on 2
    # shared cores, up to a few ms).
    assert PER_SAMPLE * 0.7 <= t.compute.model.mean_time(1) <= PER_SAMPLE * 5

    # The CLI, as an operator runs it: text, then JSON.
    address = f"127.0.0.1:{port}"
    secret_file = str(lt.workdir / "secret")
    for extra in ([], ["--json", "--top", "3"]):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crnet", "tune", address, "--secret-file", secret_file,
            "--trials", "100", *extra, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        text = out.decode()
        if extra:
            doc = json.loads(text)
            assert len(doc["ranking"]) == 3 and doc["workers"] == TREE.workers
            assert doc["running"]["scheme"] == "cr" and doc["measured"]["mean"] > 0
        else:
            assert text.startswith("tree        6 workers (+ the master), m = 24 samples")
            assert "running     (rank " in text and "best 6 of" not in text


def test_the_cli_says_what_is_wrong_without_a_traceback(tmp_path):
    runner = CliRunner()
    for args, code, said in [
        (["tune"], 2, "Missing argument"),
        (["tune", "127.0.0.1:7070", "--jsn"], 2, "No such option"),
        (["tune", "127.0.0.1:7070", "--top", "0"], 2, "--top"),
        (["tune", "no-port-here"], 2, "ADDRESS"),
        (["tune", "127.0.0.1:7070", "--bandwidth", "fast"], 2, "--bandwidth"),
        (["tune", "127.0.0.1:7070", "--secret-file", str(tmp_path / "none")], 2, "--secret-file"),
        (["tune", "127.0.0.1:1"], 1, "127.0.0.1:1"),
    ]:
        out = runner.invoke(main, args)
        assert out.exit_code == code, (args, out.output)
        assert said in out.output, (args, out.output)
        assert "Traceback" not in out.output


class FakeNode:
    """A host's --listen that answers crnet status (no secret) with ``answer`` once asked
    for measurements: the first answer (at hello) is a well-formed master."""

    def __init__(self, answer: bytes):
        self.answer = answer
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> int:
        async def serve(reader, writer):
            first = {"name": "", "host": None, "address": None, "state": "joined",
                     "tree_step": 0, "steps_done": 0, "last_step_seconds": None,
                     "straggled": None, "recent": None, "children": []}
            await reader.read(PREFIX.size)
            writer.write(encode(MsgType.STATUS_REPLY, {"id": 0, "node": first})[0])
            await reader.read(1 << 16)   # the request for measurements
            writer.write(self.answer)
            await writer.drain()
            await reader.read(1)
            writer.close()
        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()


def reply(node: dict) -> bytes:
    return encode(MsgType.STATUS_REPLY, {"id": 1, "node": node})[0]


async def test_a_malformed_or_oversized_answer_is_an_error_naming_it():
    leaf = {"name": "0", "host": None, "address": None, "state": "joined", "tree_step": 0,
            "steps_done": 0, "last_step_seconds": None, "straggled": None, "recent": None,
            "measured": {"window": 8, "processes": 1, "compute": "lots"}, "children": []}
    root = dict(leaf, name="", measured=None, children=[leaf])
    async with FakeNode(reply(root)) as port:
        with pytest.raises(CrnetError, match=r"node '0'.*compute"):
            await gather("127.0.0.1", port)
    # A header over the wire's limit (1 MiB): refused before it is read.
    head = msgpack.packb({"id": 1, "node": root, "pad": "x" * (1 << 20)})
    huge = PREFIX.pack(*PREFIX.unpack(reply(root)[:PREFIX.size])[:3], len(head), 0) + head
    async with FakeNode(huge) as port:
        with pytest.raises(CrnetError, match="exceeds the limit"):
            await gather("127.0.0.1", port)
        out = await asyncio.to_thread(CliRunner().invoke, main, ["tune", f"127.0.0.1:{port}"])
        assert out.exit_code == 1 and f"127.0.0.1:{port}: " in out.output
        assert "Traceback" not in out.output


async def test_each_local_process_has_its_window_and_the_host_its_slowest(local_tree):
    """--local-processes 2: each process's compute time is kept apart; the host's time per
    step is its slower process's (its part is in once both submitted)."""
    tree = Tree.regular(2, 1, 1)
    lt = local_tree(tree, 8, local_processes=2)
    grads = np.ones((8, 10))
    clients = list((await connect_all(lt, ("0", "1"), per_host=2)).values())

    async def run(c):
        for step in range(6):
            await asyncio.sleep(0.01 * (1 + 2 * c.assignment.process))   # 10 ms, 30 ms
            await c.allreduce(local_gradient(c.assignment, grads), step=step)
    try:
        await asyncio.gather(*(run(c) for c in clients))
    finally:
        close_all(clients)
    answer = await gather("127.0.0.1", lt.ports[MASTER])
    for child in answer["children"]:
        m = child["measured"]
        assert m["processes"] == 2 and [c["process"] for c in m["compute"]] == [0, 1]
        fast, slow = (c["micros"] for c in m["compute"])
        assert len(fast) == len(slow) == 5
        assert min(slow) >= 0.7 * 30_000 and sorted(fast)[2] < sorted(slow)[2]
    hosts = {h.name: h for h in measurements(answer).hosts}
    for name in ("0", "1"):
        load = hosts[name].local_samples
        assert load > 0 and all(x * load >= 0.7 * 0.03 for x in hosts[name].per_sample)


async def test_tune_gathers_through_tls_and_reads_its_links(local_tree, certs):
    """Under mutual TLS the asker needs the certificates as well as the secret, and the links
    under TLS are read from the kernel all the same."""
    tree = Tree.regular(2, 1, 1)
    lt = local_tree(tree, 4, secret=True, tls=certs)
    grads = np.ones((4, 10))
    clients = list((await connect_all(lt, ("0", "1"))).values())
    try:
        for step in range(3):
            await asyncio.gather(*(c.allreduce(local_gradient(c.assignment, grads), step=step)
                                   for c in clients))
    finally:
        close_all(clients)
    with pytest.raises((CrnetError, OSError, asyncio.TimeoutError)):
        await gather("127.0.0.1", lt.ports[MASTER], secret=secret_of(lt))
    answer = await gather("127.0.0.1", lt.ports[MASTER], secret=secret_of(lt), tls=certs)
    links = answer["measured"]["links"]
    assert [x["peer"] for x in links] == ["0", "1"]
    if sys.platform == "linux":
        assert all(x["min_rtt_us"] is not None and x["bytes"] > 0 for x in links)
