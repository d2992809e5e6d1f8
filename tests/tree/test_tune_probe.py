"""crnet tune --probe (issue 28, item 4): on a tree that has not trained, the master has every
node time its links and a compute kernel, authenticated, bounded, one probe at a time and
only while no job's process is attached; every field of the answer is checked."""

from __future__ import annotations

import asyncio
import re
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from crnet import AsyncClient
from crnet.cli import main
from crnet.coding.plan import Tree
from crnet.defaults import PROBE_BYTES_MAX, PROBE_FRAME, PROBE_ROUNDS
from crnet.errors import CrnetError, ProtocolError
from crnet.node.observe.probe import ProbeSink
from crnet.protocol.messages import parse
from crnet.protocol.wire import MsgType
from crnet.tools.launch import MASTER
from crnet.tools.status import StatusClient, rows
from crnet.tune.gather import gather_probe
from crnet.tune.probe import probe_size, probed_measurements
from crnet.tune.tuning import nodes, tune

from ..helpers.waits import wait_until
from .test_tune import FakeNode, reply

pytestmark = pytest.mark.timeout(120)

TREE = Tree.regular(2, 2, 1)        # master; 0, 1; 0.0, 0.1, 1.0, 1.1
BYTES = 256 << 10


def secret_of(lt) -> bytes:
    return (lt.workdir / "secret").read_bytes().strip()


async def joined(lt, secret: bytes | None = None) -> None:
    """Every worker joined (the master assigned the shares): a probe may run."""
    async def complete() -> bool:
        client = await StatusClient.connect("127.0.0.1", lt.ports[MASTER], secret=secret)
        client.close()
        return all(r.state == "joined" for r in rows(client.first))
    await wait_until(complete, "every node joined")


async def wait_out_the_pause(port: int, secret: bytes | None = None) -> None:
    """Right after a probe the master refuses the next one (issue 39 row 11: probes take at
    most ``PROBE_DUTY`` of the time), saying for how long: wait that out."""
    with pytest.raises(CrnetError, match=r"a probe ran just now.*ask again in") as refused:
        await gather_probe("127.0.0.1", port, secret=secret, probe_bytes=BYTES)
    found = re.search(r"ask again in ([\d.]+) s", str(refused.value))
    assert found is not None, refused.value
    await asyncio.sleep(float(found[1]) + 0.1)


async def test_a_probe_on_a_cold_tree_measures_every_link_and_host(local_tree):
    lt = local_tree(TREE, 24, secret=True)
    secret = secret_of(lt)
    port = lt.ports[MASTER]
    await joined(lt, secret)
    with pytest.raises(CrnetError, match="requires authentication"):
        await gather_probe("127.0.0.1", port, probe_bytes=BYTES)
    # Only the master starts one (a node's --listen answers its subtree's status only).
    with pytest.raises(CrnetError, match="only the master runs a probe"):
        await gather_probe("127.0.0.1", lt.ports["0"], secret=secret, probe_bytes=BYTES)

    tree = await gather_probe("127.0.0.1", port, secret=secret, probe_bytes=BYTES)
    by_name = {e["name"] or "master": e["measured"] for e in nodes(tree)}
    assert set(by_name) == {"master", "0", "1", "0.0", "0.1", "1.0", "1.1"}
    for name, m in by_name.items():
        probe = m["probe"]
        assert probe["bytes"] == BYTES and len(probe["kernel_micros"]) == PROBE_ROUNDS, name
        children = TREE.children("" if name == "master" else name)
        # Every child link timed every round: at least the bytes' time at 100 GB/s.
        assert [x["child"] for x in probe["links"]] == list(range(len(children))), name
        for x in probe["links"]:
            assert len(x["micros"]) == PROBE_ROUNDS and min(x["micros"]) >= BYTES / 1e5, name
        if children and sys.platform == "linux":     # the kernel's view of those flights
            assert all(x["rate"] and x["min_rtt_us"] is not None
                       for x in m["links"] if x["link"] == "child"), name

    m = probed_measurements(tree, per_sample=0.002)
    assert m.probe is not None and m.probe.bytes == BYTES and m.unmeasured == ()
    assert m.running.vector_bytes == BYTES        # no step ran: the probe's size stands in
    workers = {h.name: h for h in m.hosts if h.local_samples}
    assert set(workers) == {"0", "1", "0.0", "0.1", "1.0", "1.1"}     # the master computes none
    # Each host's kernel times over the fastest host's median, times one sample's time.
    assert min(float(np.median(h.per_sample)) for h in workers.values()) == pytest.approx(0.002)
    assert all(len(h.per_sample) == PROBE_ROUNDS for h in workers.values())
    assert all(len(h.links) == 2 * PROBE_ROUNDS for h in m.hosts if h.name in ("", "0", "1"))
    t = tune(m, trials=100)
    assert t.running.scheme == "cr" and t.ranking and t.measured_mean is None
    assert t.compute.model.mean_time(1) >= 0.002 * 0.99

    # At most a tenth of the time: the next probe waits 9 x as long as the last one took.
    await wait_out_the_pause(port, secret)
    # At most one probe at a time: a second asker is refused while the first runs.
    client = await StatusClient.connect("127.0.0.1", port, secret=secret)
    try:
        first = asyncio.ensure_future(client.refresh(20.0, measured=1, probe=16 << 20))
        await asyncio.sleep(0)       # (its request is sent)
        with pytest.raises(CrnetError, match="a probe is under way"):
            await gather_probe("127.0.0.1", port, secret=secret, probe_bytes=BYTES)
        assert (await first)["measured"]["probe"]["bytes"] == 16 << 20
    finally:
        client.close()

    # Bounded: a request for more than PROBE_BYTES_MAX is refused as it is parsed (the
    # connection closes); the daemons carry on.
    client = await StatusClient.connect("127.0.0.1", port, secret=secret)
    try:
        with pytest.raises((CrnetError, ConnectionError)):
            await client.refresh(3.0, measured=1, probe=PROBE_BYTES_MAX + 1)
    finally:
        client.close()
    assert all(p.poll() is None for p in lt.procs.values())

    # The CLI, as an operator runs it.
    await wait_out_the_pause(port, secret)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crnet", "tune", f"127.0.0.1:{port}", "--secret-file",
        str(lt.workdir / "secret"), "--probe", "--probe-bytes", "256KiB", "--per-sample", "2ms",
        "--trials", "100", "--top", "3", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert text.startswith("tree        6 workers (+ the master), m = 24 samples, 262.1 kB vectors: "
                           "a probe, not training: 262.1 kB to each child 3 times"), text
    assert "hosts' times scaled to --per-sample" in text and "best 3 of 21:" in text


async def test_the_probe_refuses_while_a_jobs_process_is_attached(local_tree):
    tree = Tree.regular(2, 1, 1)
    lt = local_tree(tree, 4)
    port = lt.ports[MASTER]
    await joined(lt)
    client = await AsyncClient.connect(lt.socket_path("0"), timeout=30, job="train")
    try:
        with pytest.raises(CrnetError, match="1 process of job 'train' attached: the probe runs "
                                             "only on an idle tree"):
            await gather_probe("127.0.0.1", port, probe_bytes=BYTES)
    finally:
        client.close()

    async def probed() -> bool:
        try:
            return (await gather_probe("127.0.0.1", port, probe_bytes=BYTES)) is not None
        except CrnetError as e:
            assert "attached" in str(e)
            return False
    await wait_until(probed, "a probe once the job's process left", every=0.2)


def peak_rss(lt, name: str) -> int:
    """Daemon ``name``'s peak resident memory so far, in bytes (Linux)."""
    with open(f"/proc/{lt.procs[name].pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
async def test_the_largest_probe_costs_the_daemons_little_memory(local_tree):
    """PROBE_BYTES_MAX to each child, three times: sent from one zeroed buffer, read into
    one of PROBE_FRAME bytes; no daemon's peak memory grows by half of one round."""
    lt = local_tree(Tree.regular(2, 1, 1), 4)
    await joined(lt)
    before = {name: peak_rss(lt, name) for name in lt.procs}
    tree = await gather_probe("127.0.0.1", lt.ports[MASTER], probe_bytes=PROBE_BYTES_MAX)
    assert [len(x["micros"]) for x in tree["measured"]["probe"]["links"]] == [PROBE_ROUNDS] * 2
    for name, was in before.items():
        assert peak_rss(lt, name) - was < PROBE_BYTES_MAX // 2, name


def node(name: str, probe: object, children: list | None = None) -> dict:
    measured = {"window": 8, "processes": 1, "local_samples": 4, "compute": [], "arrivals": [],
                "periods": {"steps": [], "micros": []}, "links": [], "summed": None,
                "config": None, "probe": probe}
    return {"name": name, "host": None, "address": None, "state": "joined", "tree_step": -1,
            "steps_done": 0, "last_step_seconds": None, "straggled": None, "recent": None,
            "measured": measured, "children": children or []}


@pytest.mark.parametrize("probe, field", [
    ({"bytes": BYTES, "kernel_micros": [0], "links": []}, "kernel_micros"),
    ({"bytes": BYTES, "kernel_micros": [1] * (PROBE_ROUNDS + 1), "links": []}, "kernel_micros"),
    ({"bytes": PROBE_BYTES_MAX + 1, "kernel_micros": [5], "links": []}, "bytes"),
    ({"bytes": BYTES, "kernel_micros": [5], "links": [{"child": 0, "micros": "fast"}]}, "micros"),
    ({"bytes": BYTES, "kernel_micros": [5], "links": "all"}, "links"),
])
async def test_a_malformed_probe_answer_is_an_error_naming_the_node(probe, field):
    good = {"bytes": BYTES, "kernel_micros": [5], "links": []}
    root = node("", good, [node("0", probe)])
    async with FakeNode(reply(root)) as port:
        with pytest.raises(CrnetError, match=rf"node '0'.*{field}"):
            await gather_probe("127.0.0.1", port, probe_bytes=BYTES)


def test_the_probe_is_bounded():
    """What a node is asked to send, and what it reads, are bounded by constants."""
    with pytest.raises(ProtocolError, match="probe"):
        parse(MsgType.STATUS, {"id": 1, "deadline": 3.0, "probe": PROBE_BYTES_MAX + 1}, 0)
    assert parse(MsgType.STATUS, {"id": 1, "deadline": 3.0, "probe": PROBE_BYTES_MAX}, 0).probe
    sink = ProbeSink()
    assert len(sink.dest(PROBE_FRAME)) == PROBE_FRAME
    with pytest.raises(ProtocolError, match="PROBE"):
        sink.dest(PROBE_FRAME + 1)
    assert probe_size(None) == 4 << 20 and probe_size(1) == 64 << 10
    assert probe_size(1 << 40) == PROBE_BYTES_MAX
    runner = CliRunner()
    for args, said in [(["--probe", "--probe-bytes", "1GB"], "--probe-bytes"),
                       (["--per-sample", "2ms"], "go with --probe"),
                       (["--probe", "--per-sample", "slow"], "--per-sample")]:
        out = runner.invoke(main, ["tune", "127.0.0.1:7070", *args])
        assert out.exit_code == 2 and said in out.output, (args, out.output)
