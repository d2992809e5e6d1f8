"""``--tls-names``: every spread rank's host id, and the certificates that must name it.

Where a spread host listens is its parent's word (JOINED's ``peers``): a broken interior
host could give its own address for a host below it and answer for that host's rank. With
one cluster secret nothing but the parent can vouch for a child; with ``--tls-names``
every host's own certificate names its host id (``crnet/protocol/tls.py``), and that its parent
cannot lend:

- a parent takes a child's HELLO only if the child's certificate names the host id the
  HELLO says (``child_named``), and reports it up with the addresses (JOINED's ``hosts``,
  ``below``);
- the master gives every rank's host id with its address (ASSIGN's ``hosts``,
  ``everyone``). A rank whose host id is that of a node above it (a parent lending its own
  identity to a child: the one way a host could answer for another rank with its own
  certificate) is left out, with its address: nobody dials it, nobody confirms its links.
  Only that parent's subtree loses (its own lie put the rank there). Two ranks with one
  host id otherwise are kept, and logged: the master cannot tell which report is true, and
  the checks below make such a host id worthless to anyone but its own holder, who dials
  and is dialed as its own rank only (a host id's holder refuses links meant for another);
- a peer link is taken only between the hosts the master named: the dialer checks that
  the acceptor's certificate names the host id of the rank it dials (``dialed_named``),
  the acceptor that the dialer's names the host id of the rank its PEER_HELLO claims, and
  that the link is meant for the acceptor's own rank (``accepted_named``).

A link that fails a check is closed and logged, and its rank counts as unreachable there,
as a peer whose rank is not confirmed (``check.py``, which still runs beside it). A
rank left out, or one where the dialer found another host (``NotThatHost``), is disowned
(``mesh.py``): at the master it owns no chunks of the sum from the next step on (spread's
``peer_disowned``), rather than fail the first step it owns.
rar needs none of this: it joins as a star, so where each ring member listens is its own
word to the master (HELLO's ``listen``), which no other host relays.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from ...coding.plan import Tree
from ...errors import NotThatHost
from ...peer_text import shown
from ...protocol.messages import PeerHello
from ...protocol.tls import names
from ..neighbours import ChildSlot

log = logging.getLogger("crnet.node")

__all__ = ["accepted_named", "below", "child_named", "dialed_named", "everyone"]


def child_named(transport, host: str | None) -> str | None:
    """Why a child's HELLO (saying host id ``host``) is refused, or None if its certificate
    names that host id."""
    if host is None:
        return "its HELLO says no host id (every host of a tree with --tls-names says its own)"
    if host not in names(transport):
        return (f"its certificate does not name the host id its HELLO says ({shown(host)}): "
                "start it with the --host-id its certificate names, or give it one that does")
    return None


def dialed_named(transport, rank: int, host: str | None) -> None:
    """``NotThatHost`` unless the certificate of the peer dialed as ``rank`` names ``host``."""
    if host is None:
        raise NotThatHost(f"the master gave no host id for rank {rank}: its peer links are not taken")
    found = names(transport)
    if host not in found:
        raise NotThatHost(f"the host there is not rank {rank}'s host {shown(host)}: its certificate "
                          f"names {', '.join(shown(n) for n in found[:4]) or 'no host'}")


def accepted_named(transport, hello: PeerHello, mine: int, hosts: tuple[str | None, ...]) -> str | None:
    """Why a peer link (its ``hello``) to this host, rank ``mine``, is refused, or None if the
    dialer's certificate names the host id of the rank it claims and it means this rank."""
    if hello.to != mine:
        return f"it says it dials rank {hello.to}, not this host's rank {mine}"
    host = hosts[hello.rank] if hello.rank < len(hosts) else None
    if host is None:
        return f"the master gave no host id for rank {hello.rank}: its peer links are not taken"
    if host not in names(transport):
        return f"its certificate does not name rank {hello.rank}'s host {shown(host)}"
    return None


def below(tree: Tree, name: str, slots: list[ChildSlot]) -> tuple[tuple[str, str], ...]:
    """The host ids of the nodes below ``name``, as far as it knows: JOINED's ``hosts``.
    A child's own is the one its certificate named (``child_named``); the rest, its word."""
    found: dict[str, str] = {}
    for child, slot in zip(tree.children(name), slots):
        if slot.host is not None:
            found[child] = slot.host
        found.update((n, h) for n, h in slot.hosts.items() if n.startswith(child + ".") and n in tree)
    return tuple(sorted(found.items()))


def everyone(tree: Tree, slots: list[ChildSlot], own: str) -> tuple[str | None, ...]:
    """At the master (host id ``own``), once every worker joined: every rank's host id,
    None for a rank left out (the module docstring)."""
    known = dict(below(tree, "", slots))
    known[""] = own
    hosts: list[str | None] = [known.get(name) for name in tree.names()]
    ranks: dict[str, list[str]] = defaultdict(list)
    for name, host in zip(tree.names(), hosts):
        if host is not None:
            ranks[host].append(name)
    for rank, name in enumerate(tree.names()):
        host = hosts[rank]
        above = _ancestors(tree, name)
        if host is not None and any(known.get(a) == host for a in above):
            lender = next(a for a in above if known.get(a) == host)
            log.error("spread: host %s is said to have host id %s, that of %s above it (a parent "
                      "lending its own identity): rank %d is left out of the peer links, and the "
                      "subtree of %s straggles", name, shown(host), lender or "the master", rank,
                      tree.parent(name) or "the master")
            hosts[rank] = None
    for host, held in ranks.items():
        if len(held) > 1:
            log.error("spread: host id %s is said of %d hosts (%s): give each host its own "
                      "--host-id and certificate; only that host id's holder is taken as any of them",
                      shown(host), len(held), ", ".join(n or "master" for n in held))
    return tuple(hosts)


def _ancestors(tree: Tree, name: str) -> list[str]:
    found = []
    parent = tree.parent(name)
    while parent is not None:
        found.append(parent)
        parent = tree.parent(parent)
    return found
