"""An emulated cluster of hosts on one Linux machine: network namespaces, a bridge, tbf.

Layout of ``EmulatedCluster(hosts=H)`` (names with the default prefix ``crn``
and an automatic per-instance tag ``T``)::

    netns crnT-h0              netns crnT-br                netns crnT-h1
    lo, eth0 10.77.0.1/24 ==== h0 --+                   +-- h1 ==== eth0 10.77.0.2/24, lo
         tbf (h0 -> bridge)    tbf  |--- br0 (bridge) --|  tbf      tbf (h1 -> bridge)
                        (bridge -> h0)                    (bridge -> h1)

* every host is a namespace with ``lo`` and one end (``eth0``) of a veth pair;
  the other end (``h<i>``) is a port of the bridge ``br0``, which lives in a
  namespace of its own. The veth pairs are created directly in those namespaces
  (``ip -n HOST link add eth0 type veth peer name h<i> netns BRIDGE``), so the
  root namespace -- the machine's real network -- is never touched: no interface,
  route, address or qdisc is added there, and the hosts have no default route.
* host ``i`` gets the ``i+1``-th address of ``subnet`` (10.77.0.1, 10.77.0.2, ...).
  Since every host is on the same bridge, the prefix of ``subnet`` is the only
  route a host has.
* every link is shaped in both directions by a ``tbf`` root qdisc: on ``eth0``
  inside the host (host -> bridge, the host's uplink) and on ``h<i>`` in the
  bridge namespace (bridge -> host, its downlink), like a switch port of that
  speed. Traffic from host a to host b therefore crosses a's uplink and b's
  downlink; n hosts sending to one host share its downlink (incast).
  There is no delay emulation (this kernel has no ``netem``): the only latency is
  the machine's own and the queueing in the shapers.

tbf parameters (see ``tbf_args``):

* ``burst`` (bucket size) defaults to ``max(rate * 4 ms, 96 KiB)``. 4 ms is one
  tick at HZ=250 (the classic rule is ``burst >= rate / HZ``, so a late timer does
  not cost rate; with HZ=1000 it is simply larger than needed), and 96 KiB holds
  the largest GSO packet TCP hands a veth as tbf measures it: 64 KiB of skb plus
  the Ethernet/IP/TCP headers of each of its ~45 segments but the first
  (``qdisc_pkt_len``), about 68.5 KB. A packet bigger than the bucket is
  software-segmented by tbf, which costs CPU on every link: with a 64 KiB bucket
  the 100 Mbit/s bandwidth preset kept both cores busy in softirqs and ran crnet's
  ring and Gloo at 0.74-1.1 s a step, 0.64-0.66 s with 96 KiB (docs/lab/ring.md,
  "The emulator's bucket"). The price of a large bucket at low rates is that the
  first ``burst`` bytes after an idle period go out unshaped (at 100 Mbit/s, 96 KiB
  is ~8 ms of line rate), so small messages see less than their serialization time.
  Pass ``burst=`` (``python -m benchmarks --burst``) to trade that off.
* ``latency 20ms``: the queue holds what the link sends in 20 ms on top of the
  bucket (``limit = rate * 20 ms + burst``: 2.5 MB at 1 Gbit/s, 250 KB at
  100 Mbit/s), deep enough that a few flows converging on one port (incast) are
  not dropped needlessly, shallow enough not to add more than 20 ms of queueing.
  A sender's own uplink rarely queues much anyway: TCP small queues keep only a
  few packets of each socket in the qdisc.

Measured on a 2-core VM (6.18 kernel), one TCP flow gets ~96% of the
configured rate as payload goodput (the rest is Ethernet/IP/TCP headers,
which tbf counts).

Cleanup: ``down()`` (also ``__exit__`` and an ``atexit`` hook registered by
``up()``) kills processes still running in the namespaces and deletes them;
deleting a namespace deletes its veth ends, and the bridge goes with its
namespace. A crashed run (SIGKILL, power loss) leaves namespaces behind:
``cleanup(prefix)`` (or ``python -m benchmarks.netns_cluster down``) removes them.

Requires root, iproute2 (``ip``, ``tc``) and the kernel's veth, bridge and tbf
support; ``requirements()`` says what is missing.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

from crnet.errors import CrnetError
from crnet.tools.procs import stop_processes
from crnet.units import parse_bandwidth

__all__ = ["EmulatedCluster", "NetnsError", "cleanup", "list_namespaces", "requirements", "tbf_args"]

IFNAMSIZ = 15          # longest interface name; netns names are kept this short too
HOST_IF = "eth0"       # the veth end inside each host namespace
BRIDGE = "br0"         # the bridge, inside the bridge namespace
TBF_LATENCY = "20ms"   # queue depth of every shaper, as time at the link's rate
BURST_TIME = 0.004     # bucket = this many seconds at the link's rate (one tick at HZ=250) ...
BURST_MIN = 96 * 1024  # ... but at least one maximal GSO packet, headers counted per segment

_seq = itertools.count()


class NetnsError(CrnetError, RuntimeError):
    """An ``ip``/``tc`` command failed; the message has the command and its stderr."""


# ---------------------------------------------------------------- shaping

def tbf_args(rate: str, burst: str | None = None, mtu: int = 1500) -> list[str]:
    """The ``tc qdisc ... tbf`` arguments that shape one direction of a link to ``rate``.

    ``rate`` is spelled as everywhere in crnet (``crnet.units.parse_bandwidth``: ``100mbit``,
    ``1Gbit``, ``12.5MB``; ``mbps`` is refused, tc would read it as megabytes); tc gets it
    in bits per second. ``burst`` (a tc size, passed to tc as is) defaults to
    ``max(rate * 4 ms, 96 KiB, 4 frames)``; see the module docstring for why.
    """
    rate_bytes = parse_bandwidth(rate)
    if rate_bytes < 1:
        raise ValueError(f"rate {rate!r} must be at least 1 byte/s")
    if burst is None:
        burst = str(int(max(rate_bytes * BURST_TIME, BURST_MIN, 4 * (mtu + 14))))
    bits = round(8 * rate_bytes)   # spelled in tc's base unit: nothing for tc to read otherwise
    return ["tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", TBF_LATENCY]


# ---------------------------------------------------------------- commands

def _cmd(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one ip/tc command; a failure raises NetnsError with its stderr."""
    try:
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetnsError(f"{' '.join(argv)}: {e}") from e
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
        raise NetnsError(f"{' '.join(argv)}: {detail}")
    return proc


def list_namespaces() -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    out = _cmd(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _ns_pids(name: str) -> list[int]:
    proc = _cmd(["ip", "netns", "pids", name], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()] if proc.returncode == 0 else []


def _kill_ns_processes(names: Sequence[str], grace: float = 2.0) -> None:
    """SIGTERM every process still running in these namespaces, SIGKILL after ``grace`` s."""
    pids = {pid for name in names for pid in _ns_pids(name)} - {os.getpid()}
    stop_processes(sorted(pids), grace)


def _delete_namespaces(names: Sequence[str], kill: bool = True) -> None:
    """Delete these namespaces; already-gone ones are fine. Raises if any is still listed after."""
    names = list(names)
    if kill:
        _kill_ns_processes(names)
    errors = []
    for name in names:
        proc = _cmd(["ip", "netns", "delete", name], check=False)
        if proc.returncode != 0 and "No such file" not in proc.stderr:
            errors.append(f"ip netns delete {name}: {proc.stderr.strip()}")
    left = set(names) & set(list_namespaces())
    if left:
        raise NetnsError(f"namespaces not deleted: {sorted(left)}"
                         + (f" ({'; '.join(errors)})" if errors else ""))


def _name_re(prefix: str, tag: str | None) -> re.Pattern:
    tag_re = "[0-9a-z]*" if tag is None else re.escape(tag)
    return re.compile(rf"^{re.escape(prefix)}{tag_re}-(?:h[0-9]+|br)$")


def cluster_namespaces(prefix: str = "crn", tag: str | None = None) -> list[str]:
    """Existing namespaces named like ours: ``{prefix}{tag}-h<i>`` or ``{prefix}{tag}-br``.

    ``tag=None`` matches any tag (every cluster with this prefix, also other
    processes' live ones!); ``tag=""`` only the fixed names the CLI uses.
    """
    pattern = _name_re(prefix, tag)
    return [name for name in list_namespaces() if pattern.match(name)]


def cleanup(prefix: str = "crn", tag: str | None = None) -> list[str]:
    """Delete leftover cluster namespaces (of crashed runs) with this prefix; returns their names.

    Only names of our form are touched (see ``cluster_namespaces``), but with the
    default ``tag=None`` that includes clusters other live processes are using.
    """
    names = cluster_namespaces(prefix, tag)
    _delete_namespaces(names)
    return names


# ---------------------------------------------------------------- requirements

@functools.cache
def requirements() -> str | None:
    """None if emulated clusters can be built here, else the reason why not.

    Checks root, ``ip`` and ``tc``, and builds (then deletes) a namespace with a
    bridge, a veth pair and a tbf qdisc, so missing kernel support shows up too.
    """
    if os.geteuid() != 0:
        return "emulated clusters need root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) not found on PATH"
    name = f"crnprobe{os.getpid():x}"[:IFNAMSIZ]
    try:
        _cmd(["ip", "netns", "add", name])
    except NetnsError as e:
        return f"cannot create a network namespace: {e}"
    try:
        for argv in (["ip", "-n", name, "link", "add", "pb", "type", "bridge"],
                     ["ip", "-n", name, "link", "add", "pa", "type", "veth", "peer", "name", "pc"],
                     ["ip", "-n", name, "link", "set", "pc", "master", "pb"],
                     ["tc", "-n", name, "qdisc", "add", "dev", "pa", "root", *tbf_args("10mbit")]):
            _cmd(argv)
    except NetnsError as e:
        return f"network namespace lacks what a cluster needs: {e}"
    finally:
        with contextlib.suppress(NetnsError):
            _delete_namespaces([name], kill=False)
    return None


# ---------------------------------------------------------------- the cluster

def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


class EmulatedCluster:
    """``hosts`` network namespaces on one bridge, every link shaped to ``rate`` both ways.

    ``names[i]`` is host i's namespace, ``addresses[i]`` its IPv4 address there;
    ``popen``/``run`` start commands inside a host. ``tag=None`` (default) makes
    the names unique to this instance (process id plus a counter, base 36);
    a fixed ``tag`` (``""`` in the CLI) gives deterministic names.
    """

    def __init__(self, hosts: int, rate: str | None = "1gbit", prefix: str = "crn",
                 subnet: str = "10.77.0.0/24", burst: str | None = None, mtu: int = 1500,
                 tag: str | None = None):
        if hosts < 1:
            raise ValueError("hosts must be >= 1")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", prefix):
            raise ValueError(f"bad prefix {prefix!r}: letters, digits and _ only, starting with a letter")
        if tag is None:
            tag = _base36(os.getpid()) + _base36(next(_seq))
        if not re.fullmatch(r"[0-9a-z]*", tag):
            raise ValueError(f"bad tag {tag!r}: lowercase letters and digits only")
        net = ipaddress.ip_network(subnet, strict=False)
        if net.version != 4:
            raise ValueError("subnet must be IPv4")
        if hosts > net.num_addresses - 2:
            raise ValueError(f"subnet {subnet} has room for {net.num_addresses - 2} hosts, not {hosts}")
        if not 68 <= mtu <= 65535:
            raise ValueError(f"bad mtu {mtu}")
        self.hosts = hosts
        self.prefix = prefix
        self.tag = tag
        self.stem = prefix + tag
        self.subnet = net
        self.mtu = mtu
        self.burst = burst
        if rate is not None:
            tbf_args(rate, burst, mtu)   # raises ValueError on a bad rate, before anything exists
        self.rate = rate
        self.names = [f"{self.stem}-h{i}" for i in range(hosts)]
        self.bridge_ns = f"{self.stem}-br"
        longest = max(self.names + [self.bridge_ns], key=len)
        if len(longest) > IFNAMSIZ:
            raise ValueError(f"namespace name {longest!r} is longer than {IFNAMSIZ} characters: "
                             "use a shorter prefix")
        self.addresses = [str(net.network_address + i + 1) for i in range(hosts)]
        self.interface = HOST_IF
        self._created: list[str] = []       # namespaces this instance created (deleted by down)
        self._procs: list[subprocess.Popen] = []
        self._atexit = None

    def __repr__(self) -> str:
        state = "up" if self._created else "down"
        return f"EmulatedCluster({self.hosts} hosts, rate={self.rate!r}, {self.stem}-*, {state})"

    # -------------------------------------------------- lifecycle

    @property
    def is_up(self) -> bool:
        return bool(self._created)

    def up(self) -> EmulatedCluster:
        """Create the namespaces, bridge, veths and shapers. On any error (or Ctrl-C),
        delete whatever this call created and re-raise."""
        if self._created:
            raise NetnsError(f"{self!r} is already up")
        prefixlen = self.subnet.prefixlen
        try:
            br = self.bridge_ns
            self._add_ns(br)
            _cmd(["ip", "-n", br, "link", "set", "lo", "up"])
            _cmd(["ip", "-n", br, "link", "add", BRIDGE, "mtu", str(self.mtu), "type", "bridge",
                  "stp_state", "0"])
            _cmd(["ip", "-n", br, "link", "set", BRIDGE, "up"])
            for i, (ns, addr) in enumerate(zip(self.names, self.addresses)):
                self._add_ns(ns)
                _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
                # Both ends are born in their namespaces: nothing ever appears in the root one.
                _cmd(["ip", "-n", ns, "link", "add", HOST_IF, "mtu", str(self.mtu), "type", "veth",
                      "peer", "name", self._port(i), "mtu", str(self.mtu), "netns", br])
                _cmd(["ip", "-n", br, "link", "set", self._port(i), "master", BRIDGE, "up"])
                _cmd(["ip", "-n", ns, "addr", "add", f"{addr}/{prefixlen}", "dev", HOST_IF])
                _cmd(["ip", "-n", ns, "link", "set", HOST_IF, "up"])
            self._shape(self.rate)
        except BaseException:
            created, self._created = self._created, []
            with contextlib.suppress(Exception):  # the original error is the one to report
                _delete_namespaces(created, kill=False)
            raise
        self._atexit = _register_atexit(self)
        return self

    def down(self) -> None:
        """Stop what ``popen`` started, kill anything else left inside, delete the namespaces.

        Idempotent; parts already gone are fine. Raises NetnsError only if a
        namespace of ours is still listed afterwards.
        """
        stop_processes(self._procs, grace=2.0)
        self._procs.clear()
        self.detach()
        names = self.names + [self.bridge_ns] if self._created else []
        self._created = []
        _delete_namespaces(names)

    def detach(self) -> None:
        """Let the cluster outlive this process: drop the exit hook (``down()`` still works,
        and ``cleanup``/``python -m benchmarks.netns_cluster down`` remove it later)."""
        if self._atexit is not None:
            atexit.unregister(self._atexit)
            self._atexit = None

    def __enter__(self) -> EmulatedCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def exists(self) -> list[str]:
        """Which of this cluster's namespaces currently exist."""
        mine = set(self.names) | {self.bridge_ns}
        return [name for name in list_namespaces() if name in mine]

    # -------------------------------------------------- shaping

    def set_rate(self, rate: str | None) -> None:
        """Re-shape every link, both directions (None removes the shapers)."""
        if rate is not None:
            tbf_args(rate, self.burst, self.mtu)   # validate before touching anything
        if not self._created:
            raise NetnsError(f"{self!r} is not up")
        self._shape(rate)
        self.rate = rate

    def links(self) -> list[tuple[str, str]]:
        """Every shaped (namespace, device): host i's eth0 (uplink), then bridge port h<i> (downlink)."""
        out = []
        for i, ns in enumerate(self.names):
            out += [(ns, HOST_IF), (self.bridge_ns, self._port(i))]
        return out

    def _shape(self, rate: str | None) -> None:
        for ns, dev in self.links():
            if rate is None:
                proc = _cmd(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
                if proc.returncode != 0 and not re.search(r"No such file|Cannot find|handle of zero",
                                                          proc.stderr):
                    raise NetnsError(f"tc -n {ns} qdisc del dev {dev} root: {proc.stderr.strip()}")
            else:
                _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
                      *tbf_args(rate, self.burst, self.mtu)])

    def set_link(self, host: int, up: bool) -> None:
        """Take host ``host``'s link down (``up=False``) or bring it back: its bridge port, as
        if its cable were pulled at the switch. The host keeps its address, routes and
        sockets; what it sends meanwhile is lost, and TCP retransmits it once the link is up."""
        if not self._created:
            raise NetnsError(f"{self!r} is not up")
        _cmd(["ip", "-n", self.bridge_ns, "link", "set", self._port(host), "up" if up else "down"])

    # -------------------------------------------------- running things inside

    def exec_argv(self, host: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside host ``host``."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of arguments, not a string")
        return ["ip", "netns", "exec", self.names[host], *map(os.fspath, argv)]

    def popen(self, host: int, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start ``argv`` inside host ``host`` (``ip netns exec NAME ...``); ``down()`` stops it."""
        proc = subprocess.Popen(self.exec_argv(host, argv), **kw)
        self._procs.append(proc)
        return proc

    def run(self, host: int, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """``subprocess.run(argv, **kw)`` inside host ``host``."""
        return subprocess.run(self.exec_argv(host, argv), **kw)

    # -------------------------------------------------- internals

    @staticmethod
    def _port(i: int) -> str:
        return f"h{i}"

    def _add_ns(self, name: str) -> None:
        _cmd(["ip", "netns", "add", name])   # fails if it exists: never adopt someone else's
        self._created.append(name)


def hosting(cluster, names: Sequence[str]) -> dict:
    """``LocalTree`` options that put tree node ``names[i]`` on host i of ``cluster`` (an
    ``EmulatedCluster``, or anything with its ``addresses`` and ``popen``): its address there,
    and its daemon started there."""
    host_of = {n: i for i, n in enumerate(names)}
    return dict(addresses={n: cluster.addresses[host_of[n]] for n in names},
                spawn=lambda name, argv, kw: cluster.popen(host_of[name], argv, **kw))


def _register_atexit(cluster: EmulatedCluster):
    """Take the cluster down at interpreter exit if nobody did (holds it alive until then)."""
    def _down_at_exit():
        if cluster.is_up:
            with contextlib.suppress(Exception):  # at exit: nobody is left to report to
                cluster.down()

    atexit.register(_down_at_exit)
    return _down_at_exit
