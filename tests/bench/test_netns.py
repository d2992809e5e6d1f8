"""benchmarks.netns: emulated clusters of network namespaces on a bridge, links shaped by tbf.

Building clusters needs root and iproute2; those tests are skipped (with the reason) otherwise.
Every cluster here uses the prefix ``crt`` plus a per-instance tag, so it cannot
collide with a concurrent run, a benchmark (``crn``) or the CLI.
"""
from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
import textwrap

import pytest

from benchmarks import netns
from benchmarks.presets import PRESETS
from crnet.errors import CrnetError

REASON = netns.requirements()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}")

PREFIX = "crt"
PY = sys.executable

ECHO_SERVER = textwrap.dedent("""
    import socket, sys, threading
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
    print("ready", flush=True)
    def serve(c):
        with c:
            while data := c.recv(65536):
                c.sendall(data)
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
""")

ECHO_CLIENT = textwrap.dedent("""
    import socket, sys
    for addr in sys.argv[2:]:
        msg = f"hello {addr} from {sys.argv[1]}".encode()
        with socket.create_connection((addr, 7007), timeout=5) as c:
            c.sendall(msg); c.shutdown(socket.SHUT_WR)
            got = b""
            while chunk := c.recv(65536):
                got += chunk
        assert got == msg, (addr, got)
        print("ok", addr)
""")

# Receives one connection to EOF; prints bytes and seconds from its first byte to EOF.
SINK = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
    print("ready", flush=True)
    c, _ = s.accept(); buf = bytearray(1 << 20); n = 0; t0 = None
    while k := c.recv_into(buf):
        if t0 is None:
            t0 = time.perf_counter()
        n += k
    print(n, time.perf_counter() - t0, flush=True)
""")

SOURCE = textwrap.dedent("""
    import socket, sys
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as c:
        c.sendall(bytes(int(sys.argv[3])))
""")

CONNECT = textwrap.dedent("""
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
        print("connected")
    except OSError as e:
        print(type(e).__name__, e.errno)
""")


def tbf_value(args: list[str], key: str) -> str:
    return args[args.index(key) + 1]


@pytest.mark.parametrize("rate, bits", [("100mbit", 100_000_000), ("1Gbit", 1_000_000_000),
                                        ("50mbit/s", 50_000_000), ("12.5MB", 100_000_000),
                                        ("12.5MB/s", 100_000_000), ("1MiB", 8 * 2**20)])
def test_tbf_gets_the_rate_in_bits(rate, bits):
    assert tbf_value(netns.tbf_args(rate), "rate") == f"{bits}bit"


def test_tbf_burst_is_4ms_of_the_rate_or_one_gso_packet():
    assert tbf_value(netns.tbf_args("1gbit"), "burst") == "500000"
    # A 64 KiB GSO packet is ~68.5 KB to tbf (each segment's headers counted): a smaller
    # bucket would segment it in software.
    assert tbf_value(netns.tbf_args("10mbit"), "burst") == "98304"
    assert tbf_value(netns.tbf_args("100mbit"), "burst") == "98304"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_rates_parse(name):
    rate = PRESETS[name].rate
    if rate is None:   # unshaped links (the fast presets): no shaper to spell
        return
    bits = {"1gbit": 10**9, "100mbit": 10**8}[rate]
    assert tbf_value(netns.tbf_args(rate), "rate") == f"{bits}bit"


@pytest.mark.parametrize("rate", ["12.5mbps", "100Mbps"])
def test_ambiguous_mbps_is_refused(rate):
    # tc reads "mbps" as megabytes per second, most people as megabits: neither guess.
    with pytest.raises(ValueError, match="is ambiguous: write"):
        netns.tbf_args(rate)
    with pytest.raises(ValueError, match="is ambiguous"):
        netns.EmulatedCluster(2, rate=rate, prefix=PREFIX)   # before anything exists


def test_netns_errors_are_crnet_errors():
    assert issubclass(netns.NetnsError, CrnetError) and issubclass(netns.NetnsError, RuntimeError)


@pytest.fixture
def cluster():
    """``cluster(hosts, **kw)`` brings a cluster up; all are taken down at teardown."""
    made = []

    def make(hosts: int, **kw) -> netns.EmulatedCluster:
        c = netns.EmulatedCluster(hosts, prefix=PREFIX, **kw)
        made.append(c)
        return c.up()

    yield make
    for c in made:
        c.down()
        assert c.exists() == []


def start_server(c: netns.EmulatedCluster, host: int, script: str, *args) -> subprocess.Popen:
    proc = c.popen(host, [PY, "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def ours() -> list[str]:
    return netns.cluster_namespaces(PREFIX)


def stem_namespaces(c: netns.EmulatedCluster) -> list[str]:
    return [n for n in netns.list_namespaces() if n.startswith(c.stem + "-")]


def transfer_mbit(c: netns.EmulatedCluster, src: int, dst: int, nbytes: int, port: int) -> float:
    sink = start_server(c, dst, SINK, c.addresses[dst], port)
    c.run(src, [PY, "-c", SOURCE, c.addresses[dst], str(port), str(nbytes)], check=True, timeout=60)
    out, _ = sink.communicate(timeout=60)
    got, seconds = out.split()
    assert int(got) == nbytes
    return nbytes * 8 / float(seconds) / 1e6


@needs_netns
@pytest.mark.timeout(120)
def test_hosts_reach_each_other_over_tcp(cluster):
    c = cluster(3, rate="100mbit")
    assert len(set(c.names)) == 3 and all(len(n) <= 15 for n in c.names + [c.bridge_ns])
    assert c.addresses == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    for i in range(3):
        start_server(c, i, ECHO_SERVER, c.addresses[i], 7007)
    for i in range(3):
        others = [a for j, a in enumerate(c.addresses) if j != i]
        res = c.run(i, [PY, "-c", ECHO_CLIENT, str(i), *others], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["ok", others[0], "ok", others[1]]


@needs_netns
@pytest.mark.timeout(120)
def test_links_are_shaped_both_ways(cluster):
    c = cluster(2, rate="50mbit")
    for ns, dev in c.links():   # host's eth0 (uplink) and its bridge port (downlink)
        q = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                           capture_output=True, text=True).stdout
        assert "tbf" in q and "rate 50Mbit" in q, (ns, dev, q)

    shaped = transfer_mbit(c, 0, 1, 3 << 20, 7101)
    back = transfer_mbit(c, 1, 0, 3 << 20, 7102)
    assert 0.6 * 50 <= shaped <= 1.1 * 50, shaped
    assert 0.6 * 50 <= back <= 1.1 * 50, back

    c.set_rate(None)
    for ns, dev in c.links():
        q = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                           capture_output=True, text=True).stdout
        assert "tbf" not in q
    unshaped = transfer_mbit(c, 0, 1, 3 << 20, 7103)
    assert unshaped > 3 * shaped, (unshaped, shaped)

    c.set_rate("20mbit")   # re-shaping a running cluster takes effect
    assert 0.6 * 20 <= transfer_mbit(c, 0, 1, 1 << 20, 7104) <= 1.1 * 20


@needs_netns
@pytest.mark.timeout(120)
def test_down_removes_everything():
    c = netns.EmulatedCluster(3, rate="10mbit", prefix=PREFIX).up()
    assert sorted(stem_namespaces(c)) == sorted(c.names + [c.bridge_ns])
    sleeper = c.popen(1, ["sleep", "600"])
    c.down()
    assert stem_namespaces(c) == []
    assert sleeper.poll() is not None    # down() stops what popen started
    c.down()                             # idempotent
    assert stem_namespaces(c) == []


@needs_netns
@pytest.mark.timeout(120)
def test_failed_up_leaves_nothing(monkeypatch):
    # A bad rate is refused before anything exists.
    with pytest.raises(ValueError, match="bandwidth 'fast'"):
        netns.EmulatedCluster(3, rate="fast", prefix=PREFIX)
    # A bad burst is passed to tc, which refuses it at the last step of up(),
    # after every namespace, veth and the bridge exist.
    c = netns.EmulatedCluster(3, rate="50mbit", burst="lots", prefix=PREFIX)
    with pytest.raises(netns.NetnsError, match="tc"):
        c.up()
    assert stem_namespaces(c) == [] and not c.is_up
    c.down()

    # A failure in the middle of building host 2 (after hosts 0, 1 and the bridge).
    real = netns._cmd

    def failing(argv, check=True):
        if argv[:3] == ["ip", "-n", c2.names[2]] and "veth" in argv:
            raise netns.NetnsError("injected failure")
        return real(argv, check)

    c2 = netns.EmulatedCluster(3, rate="50mbit", prefix=PREFIX)
    monkeypatch.setattr(netns, "_cmd", failing)
    with pytest.raises(netns.NetnsError, match="injected"):
        c2.up()
    monkeypatch.undo()
    assert stem_namespaces(c2) == []

    # up() never adopts or deletes namespaces it did not create.
    a = netns.EmulatedCluster(2, rate=None, prefix=PREFIX).up()
    try:
        b = netns.EmulatedCluster(2, rate=None, prefix=PREFIX, tag=a.tag)
        with pytest.raises(netns.NetnsError, match="exists"):
            b.up()
        assert sorted(stem_namespaces(a)) == sorted(a.names + [a.bridge_ns])
    finally:
        a.down()
    assert stem_namespaces(a) == []


def root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def root_routes() -> str:
    return subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True).stdout


@needs_netns
@pytest.mark.timeout(120)
def test_traffic_stays_inside_the_namespaces(cluster):
    links, routes = root_links(), root_routes()
    c = cluster(2, rate="100mbit")
    # Nothing was added to the root namespace.
    assert root_links() == links and root_routes() == routes
    for i in range(2):
        route = c.run(i, ["ip", "-4", "route", "show"], capture_output=True, text=True, check=True).stdout
        assert "default" not in route and route.split()[0] == "10.77.0.0/24", route
    bridge_addrs = subprocess.run(["ip", "-n", c.bridge_ns, "-4", "-o", "addr"], capture_output=True,
                                  text=True, check=True).stdout
    assert [line.split()[1] for line in bridge_addrs.splitlines()] == ["lo"]

    # A server on the root namespace's 127.0.0.1 is not reachable from a host's 127.0.0.1.
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        res = c.run(0, [PY, "-c", CONNECT, "127.0.0.1", str(port)], capture_output=True, text=True,
                    timeout=30)
        assert res.stdout.split()[0] == "ConnectionRefusedError", res.stdout + res.stderr
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()

    # The root namespace's own addresses are unroutable from inside (no default route).
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True,
                         text=True).stdout
    root_addrs = [line.split()[3].split("/")[0] for line in out.splitlines()]
    root_addrs = [a for a in root_addrs if ipaddress.ip_address(a) not in c.subnet] + ["8.8.8.8"]
    for addr in root_addrs:
        res = c.run(1, [PY, "-c", CONNECT, addr, "22"], capture_output=True, text=True, timeout=30)
        assert res.stdout.split()[0] == "OSError" and res.stdout.split()[1] == "101", (addr, res.stdout)
