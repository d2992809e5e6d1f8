"""Which child slot a host gets: a parent remembers, for this run, the slot each host id
held (``held``: host id -> slot), so that a restarted host without ``--name`` gets its
slot (and its share) back."""

from __future__ import annotations

from .neighbours import ChildSlot


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
