"""Which child slot a host gets: the one it names, or else a parent remembers, for this
run, the slot each host id held (``held``: host id -> slot), so that a restarted host
without ``--name`` gets its slot (and its share) back."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...errors import JoinRefused
from ...peer_text import shown
from ...protocol.messages import Hello
from ...protocol.transport import Connection
from ...schemes import Place
from ..neighbours import ChildSlot

log = logging.getLogger("crnet.node")


def reached_at(listen: str | None, peer: str) -> str | None:
    """Where a child that listens at ``listen`` and connected from ``peer`` (host:port)
    is reached: one that listens everywhere (0.0.0.0) at the address it connected from."""
    if listen is not None and listen.startswith("0.0.0.0:"):
        return f"{peer.rpartition(':')[0]}:{listen.rpartition(':')[2]}"
    return listen


def slot_for(place: Place, slots: list[ChildSlot], held: dict[str, int], hello: Hello,
             conn: Connection, contested: Callable[[int, Connection], object]) -> int:
    """The child slot at ``place`` that ``hello`` (on ``conn``) gets, or ``JoinRefused``
    (a leaf has none): the slot it names, if that is a child's of ``place`` and free;
    without a name, by its host id (``pick_slot``). A named slot held by a live link is
    not taken: with the cluster's own node asking (a restart while the old connection has
    not noticed that its peer died, or a broken host), ``contested(k, holder)`` asks the
    holder whether it is alive; until then the newcomer is told to try again."""
    if place.is_leaf:
        raise JoinRefused(f"{place.label} is a leaf (layer {place.layer} of "
                          f"{place.tree.layers}): it accepts no children")
    children = place.tree.children(place.name)
    if hello.name is None:
        if all(slot.link is not None for slot in slots):
            raise JoinRefused(f"{place.label} has all {len(slots)} child slots taken")
        k, before = pick_slot(held, hello.host, slots)
        if before is not None:
            log.warning("host id %s connected from %s, but it holds child slot %s from %s: giving "
                        "this one another slot (two daemons with one host id? give each its own "
                        "--host-id)", shown(hello.host), conn.label, children[before],
                        slots[before].peer)
        return k
    if hello.name not in children:
        raise JoinRefused(f"{shown(hello.name)} is not a child of {place.label} "
                          f"(its children are {children[0]}..{children[-1]})")
    k = children.index(hello.name)
    holder = slots[k].link
    if holder is not None:
        if conn.authenticated:
            contested(k, holder)
        raise JoinRefused(f"slot {hello.name} of {place.label} is held by a live connection",
                          retry=True)
    return k


def pick_slot(held: dict[str, int], host: str | None, slots: list[ChildSlot]) -> tuple[int, int | None]:
    """The slot for a child without ``--name`` (some slot must be free): the one its host
    id held before, if free; else a free one no other host id held (else any free one).
    With it, the slot its host id holds through another live link (a second node with
    one host id: it is not refused, but the host id keeps its slot)."""
    free = [k for k, slot in enumerate(slots) if slot.link is None]
    before = None if host is None else held.get(host)
    if before is not None and slots[before].link is None:
        return before, None
    unclaimed = [k for k in free if k not in held.values()]
    return (unclaimed or free)[0], before


def claim_slot(held: dict[str, int], host: str | None, k: int, named: bool) -> None:
    """Slot ``k`` is ``host``'s from now on: the one it named, or was given (not a second
    node that shares a host id with a live one: that one keeps its slot)."""
    if host is not None and (named or held.get(host, k) == k):
        for other in [h for h, slot in held.items() if slot == k]:
            del held[other]      # the slot is this host's now
        held[host] = k
