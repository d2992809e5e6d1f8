"""Bring an emulated cluster (benchmarks.netns) up or down from the shell.

    python -m benchmarks.netns_cluster up --hosts 4 --rate 100mbit [--prefix crn]
    ip netns exec crn-h0 python -m crnet ...        # run something on host 0
    python -m benchmarks.netns_cluster status
    python -m benchmarks.netns_cluster down [--prefix crn]

Unlike the library's default (names unique to the creating process), the
namespaces made here are named deterministically from --prefix (``P-h0`` ...
``P-h<H-1>``, bridge ``P-br``) and stay after this script exits, so that
``down --prefix P`` (or a later ``status``) can find them. ``down`` removes
every namespace named like a cluster with that prefix, after killing processes
still inside: also per-process clusters (``P<tag>-h<i>``) such as leftovers of
crashed runs -- and live ones of a running benchmark using the same prefix
(``--exact`` spares those). The tests use their own prefix, ``crt``.
Needs root and iproute2.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

from . import netns


def fail(msg: str, code: int = 2) -> None:
    print(f"netns_cluster: error: {msg}", file=sys.stderr)
    sys.exit(code)


def check_basic() -> None:
    if os.geteuid() != 0:
        fail("must run as root (network namespaces, veth and tc need CAP_NET_ADMIN)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            fail(f"`{tool}` (iproute2) not found on PATH")


def cmd_up(args) -> None:
    reason = netns.requirements()
    if reason:
        fail(reason)
    existing = netns.cluster_namespaces(args.prefix, "")
    if existing:
        fail(f"a cluster with prefix {args.prefix!r} is already up ({len(existing)} namespaces); "
             f"run `down --prefix {args.prefix}` first")
    rate = None if args.rate.lower() in ("none", "0", "off", "unshaped") else args.rate
    try:
        cluster = netns.EmulatedCluster(args.hosts, rate=rate, prefix=args.prefix, subnet=args.subnet,
                                        burst=args.burst, mtu=args.mtu, tag="")
        cluster.up()
    except (ValueError, netns.NetnsError) as e:
        fail(str(e), 1)
    cluster.detach()   # keep it after we exit
    print(f"emulated cluster up: {args.hosts} hosts, links {rate or 'unshaped'} both ways, "
          f"bridge in netns {cluster.bridge_ns}")
    for i, (name, addr) in enumerate(zip(cluster.names, cluster.addresses)):
        print(f"  host {i:<3} netns {name:<16} {cluster.interface} {addr}/{cluster.subnet.prefixlen}")
    print(f"run a command in one:  ip netns exec {cluster.names[0]} <cmd> ...")
    print(f"take it down:          python -m benchmarks.netns_cluster down --prefix {args.prefix}")


def cmd_down(args) -> None:
    check_basic()
    try:
        removed = netns.cleanup(args.prefix, "" if args.exact else None)
    except netns.NetnsError as e:
        fail(str(e), 1)
    if removed:
        print(f"removed {len(removed)} namespaces: {' '.join(sorted(removed))}")
    else:
        print(f"nothing to remove (no namespaces named {args.prefix}-h<i> / {args.prefix}-br"
              + ("" if args.exact else f" or {args.prefix}<tag>-...") + ")")


def _ns_info(name: str, dev: str) -> tuple[str, str]:
    fields = subprocess.run(["ip", "-n", name, "-4", "-o", "addr", "show", "dev", dev],
                            capture_output=True, text=True).stdout.split()
    addr = fields[3] if len(fields) > 3 else "-"
    q = subprocess.run(["tc", "-n", name, "qdisc", "show", "dev", dev, "root"],
                       capture_output=True, text=True).stdout
    m = re.search(r"tbf .*?rate (\S+)", q)
    return addr, (m.group(1) if m else "unshaped")


def cmd_status(args) -> None:
    check_basic()
    names = netns.cluster_namespaces(args.prefix, None)
    if not names:
        print(f"no emulated cluster namespaces with prefix {args.prefix!r}")
        return
    clusters: dict[str, list[str]] = {}
    for name in names:
        clusters.setdefault(name.rsplit("-", 1)[0], []).append(name)
    for stem, members in sorted(clusters.items()):
        hosts = sorted((n for n in members if not n.endswith("-br")), key=lambda n: int(n.rsplit("-h", 1)[1]))
        bridge = f"{stem}-br"
        print(f"cluster {stem}: {len(hosts)} hosts, bridge netns "
              f"{bridge if bridge in members else '(missing!)'}")
        for host in hosts:
            i = int(host.rsplit("-h", 1)[1])
            addr, up_rate = _ns_info(host, netns.HOST_IF)
            down_rate = _ns_info(bridge, f"h{i}")[1] if bridge in members else "-"
            print(f"  {host:<16} {addr:<18} up {up_rate:<10} down {down_rate}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.netns_cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create H hosts on a bridge, links shaped to --rate")
    up.add_argument("--hosts", type=int, required=True)
    up.add_argument("--rate", default="1gbit",
                    help="every link's rate, both ways: 100mbit, 1gbit (bits/s) or 12.5MB "
                         "(bytes/s); 'none': unshaped")
    up.add_argument("--prefix", default="crn")
    up.add_argument("--subnet", default="10.77.0.0/24")
    up.add_argument("--burst", default=None, help="tbf burst (tc size); default max(rate*4ms, 96KiB)")
    up.add_argument("--mtu", type=int, default=1500)
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="delete every cluster with --prefix (kills processes inside)")
    down.add_argument("--prefix", default="crn")
    down.add_argument("--exact", action="store_true",
                      help="only the CLI's own names (P-h<i>, P-br), not per-process clusters P<tag>-...")
    down.set_defaults(func=cmd_down)
    status = sub.add_parser("status", help="list clusters with --prefix (any tag), addresses and rates")
    status.add_argument("--prefix", default="crn")
    status.set_defaults(func=cmd_status)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
