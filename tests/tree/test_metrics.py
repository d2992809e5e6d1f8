"""crnetd --metrics: Prometheus text from the daemon's own loop, checked against a real run."""

import asyncio
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from crnet.cli import crnetd
from crnet.coding.plan import Tree
from crnet.node.observe import metrics
from crnet.node.observe.metrics import MetricsServer
from crnet.tools.launch import MASTER, free_port

from ..helpers.clients import close_all, connect_all
from ..helpers.trees import KILL
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import wait_until

pytestmark = pytest.mark.timeout(120)


def with_metrics(ports: dict[str, int]):
    """A LocalTree ``spawn`` that gives every daemon ``--metrics`` on a port of its own."""
    import subprocess

    def spawn(name, argv, kwargs):
        ports.setdefault(name, free_port())
        return subprocess.Popen([*argv, "--metrics", str(ports[name])], **kwargs)
    return spawn


def scrape(port: int, token: str | None = None) -> dict:
    """{(sample name, sorted labels): value} of one scrape."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def test_metrics_match_a_run_with_stragglers_and_a_killed_child(local_tree):
    tree = Tree.regular(3, 1, 1)                      # the master and 3 workers, s = 1
    grads = gradients(0, 30, 8)
    ports: dict[str, int] = {}
    lt = local_tree(tree, 30, spawn=with_metrics(ports))
    names = ["0", "1", "2"]
    clients = await connect_all(lt, names)
    slow = {1, 5, 9}                                  # steps where worker 2 straggles
    steps, after_kill = 12, 4

    async def part(name: str, step: int):
        if name == "2" and step in slow:
            await asyncio.sleep(0.5)                  # the tree finishes without it
        c = clients[name]
        return await c.allreduce(local_gradient(c.assignment, grads), step=step)

    try:
        for step in range(steps):
            for got in await asyncio.gather(*(part(n, step) for n in names)):
                assert rel_error(got, grads.sum(axis=0)) <= 1e-9
        clients.pop("2").close()
        lt.signal("2", KILL)
        await wait_until(lambda: value(scrape(ports[MASTER]), "crnet_link_up", link="child",
                                       peer="2") == 0, "the master to see child 2 gone")
        for step in range(steps, steps + after_kill):
            for got in await asyncio.gather(*(part(n, step) for n in ("0", "1"))):
                assert rel_error(got, grads.sum(axis=0)) <= 1e-9
        sent = {n: (await clients[n].stats())["stats"]["steps_done"] for n in ("0", "1")}
    finally:
        close_all(clients)
    total = steps + after_kill
    assert sent == {"0": total, "1": total}
    master = scrape(ports[MASTER])
    workers = {n: scrape(ports[n]) for n in ("0", "1")}
    for samples in (master, *workers.values()):
        assert value(samples, "crnet_steps_done_total") == total
        assert value(samples, "crnet_steps_failed_total", scope="tree") == 0
        assert value(samples, "crnet_steps_failed_total", scope="here") == 0
        assert value(samples, "crnet_tree_step") == total - 1
        assert value(samples, "crnet_join_state", state="assigned") == 1
    # One step-time observation per step at the master, and each lies within the run.
    assert value(master, "crnet_step_seconds_count") == total
    assert value(master, "crnet_step_seconds_bucket", le="+Inf") == total
    assert 0 < value(master, "crnet_step_seconds_sum") < 60
    # Each step is decoded from the first n - s = 2 children: one of the 3 is left out of
    # every step; child 2 at least of every step it straggled in and every one after its death.
    skipped = {c: value(master, "crnet_child_skipped_steps_total", child=c) for c in names}
    assert sum(skipped.values()) == total
    assert skipped["2"] >= len(slow) + after_kill
    assert value(master, "crnet_link_up", link="child", peer="2") == 0
    # A lag is observed for each child whose part came before the step was decided here: at
    # least the 2 it was decoded from, per step; child 2 none after its death.
    lags = {c: value(master, "crnet_child_arrival_lag_seconds_count", child=c) for c in names}
    assert sum(lags.values()) >= 2 * total and lags["2"] <= steps
    assert all(lags[c] >= total - skipped[c] for c in names)
    for child in ("0", "1"):
        assert value(master, "crnet_link_up", link="child", peer=child) == 1
        # What each child sent on its parent link reached the master on that link: at least
        # its vector (8 float64) for every step.
        up = value(workers[child], "crnet_link_sent_bytes_total", link="parent",
                   peer=f"127.0.0.1:{lt.ports[MASTER]}")
        assert value(master, "crnet_link_received_bytes_total", link="child", peer=child) >= up
        assert up >= total * 8 * 8
    # The leaves' processes took results straight into their shared memory; the master,
    # which sends each on to its children, copies.
    assert value(master, "crnet_results_direct_total") == 0
    assert all(value(w, "crnet_results_direct_total") > 0 for w in workers.values())
    # The results the master keeps for its (idle) training process, counted in bytes.
    assert value(master, "crnet_result_memory_bytes") >= 8 * 8
    assert value(master, "crnet_decode_cpu_seconds_total") > 0


def registry(count: int = 3) -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("crnet_example", "an example", registry=r).inc(count)
    return r


async def request(port: int, data: bytes, read: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10) if read else b""
    finally:
        writer.close()


async def test_a_token_is_required_and_checked_and_only_get_metrics_is_served():
    server = MetricsServer(registry(), ("127.0.0.1", 0), token=b"s3cret-token-of-16+")
    await server.start()
    port = server.bound[1]
    try:
        bare = await request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert bare.startswith(b"HTTP/1.1 401 ") and b"crnet_example" not in bare
        wrong = await request(port, b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer nope\r\n\r\n")
        assert wrong.startswith(b"HTTP/1.1 401 ") and wrong.endswith(b"\r\n\r\n")
        other = await request(port, b"GET / HTTP/1.1\r\nAuthorization: Bearer s3cret-token-of-16+\r\n\r\n")
        assert other.startswith(b"HTTP/1.1 404 ")
        post = await request(port, b"POST /metrics HTTP/1.1\r\nauthorization: bearer "
                                   b"s3cret-token-of-16+\r\n\r\n")
        assert post.startswith(b"HTTP/1.1 405 ")
        good = await request(port, b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer "
                                   b"s3cret-token-of-16+\r\n\r\n")
        assert good.startswith(b"HTTP/1.1 200 ") and b"crnet_example_total 3.0" in good
        # More than MAX_REQUEST bytes of headers: dropped without an answer.
        assert await request(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 8000 + b"\r\n\r\n") == b""
    finally:
        server.close()


async def test_a_scraper_that_says_nothing_is_dropped(monkeypatch):
    monkeypatch.setattr(metrics, "REQUEST_DEADLINE", 0.2)
    server = MetricsServer(registry(), ("127.0.0.1", 0))
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.bound[1])
        assert await asyncio.wait_for(reader.read(), 5) == b""     # closed on us, unanswered
        writer.close()
        # Without a token (loopback), a plain scrape works.
        samples = await asyncio.to_thread(scrape, server.bound[1])
        assert value(samples, "crnet_example_total") == 3
    finally:
        server.close()


def test_crnetd_refuses_metrics_beyond_loopback_without_a_token():
    result = CliRunner().invoke(crnetd, ["--role", "master", "--listen", "127.0.0.1:0",
                                         "--samples", "6", "--metrics", "0.0.0.0:9100"])
    assert result.exit_code == 2
    assert "refusing to serve metrics on 0.0.0.0 without --metrics-token-file" in result.output


async def test_urlopen_sees_401_without_the_token_on_a_real_daemon(local_tree, tmp_path):
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    ports: dict[str, int] = {}
    import subprocess

    def spawn(name, argv, kwargs):
        ports[name] = free_port()
        return subprocess.Popen([*argv, "--metrics", f"127.0.0.1:{ports[name]}",
                                 "--metrics-token-file", str(token)], **kwargs)
    local_tree(Tree.regular(1, 1, 0), 4, spawn=spawn)
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(ports[MASTER])
    assert e.value.code == 401
    # (The daemons are up; the tree is assigned once the worker has joined.)
    await wait_until(lambda: value(scrape(ports[MASTER], "t" * 32), "crnet_join_state",
                                   state="assigned") == 1, "the master assigned, seen in its metrics")
