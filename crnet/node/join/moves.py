"""Moving hosts between parents: where each host of a tree goes in a tree of another shape.

``--plan auto`` (``replan.py``) may choose another fanout or depth, or rar or spread, whose
links are made as hosts join. Then the master sends MOVE down the running tree between
jobs: every host leaves its parent and joins its new one, as a host that just started
would (``Membership.moved``). Which host goes where is decided here, from names and
addresses only (no I/O), and so is where a node joins (``Whereabouts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from ...coding.plan import Tree
from ...errors import JoinRefused
from ...protocol.messages import Hello

# One host's entry: its name now, its name in the new tree, its new parent's address
# (None: the master's) and where it listens (how a host that restarts is found again).
MoveEntry = tuple[str, str, "str | None", "str | None"]


def placement(old: Tree, new: Tree, listening: Collection[str], peers: bool) -> dict[str, str] | None:
    """Old name -> new name for every worker (``old`` and ``new`` have as many), or None
    when too few hosts listen (``listening``: their old names) for the places that must
    accept links: every parent of ``new``, and every place with ``peers`` (rar, spread).
    The hosts keep their rank order if that puts a listening host at every such place;
    else the listening ones take the parents' places first, each group in rank order."""
    olds, news = [n for n in old.names() if n], [n for n in new.names() if n]
    if len(olds) != len(news):
        raise ValueError(f"a tree of {len(olds)} workers cannot move to one of {len(news)}")
    must = [n for n in news if peers or new.children(n)]
    hearing = [o for o in olds if o in listening]
    if len(hearing) < len(must):
        return None
    in_order = dict(zip(olds, news))
    if all(o in listening for o, n in in_order.items() if n in must):
        return in_order
    out = dict(zip(hearing, must))
    rest = [n for n in news if n not in must]
    out.update(zip([o for o in olds if o not in out], rest))
    return out


def move_table(where: Mapping[str, str], new: Tree,
               addresses: Mapping[str, str | None]) -> tuple[MoveEntry, ...]:
    """MOVE's entries for ``where`` (``placement``), with each host's listen address
    (``addresses``, by old name)."""
    host_at = {n: o for o, n in where.items()}
    out = []
    for old_name, name in where.items():
        parent = new.parent(name)
        assert parent is not None
        to = None if parent == "" else addresses[host_at[parent]]
        out.append((old_name, name, to, addresses.get(old_name)))
    return tuple(out)


def with_master(table: tuple[MoveEntry, ...], address: str | None) -> tuple[MoveEntry, ...]:
    """``table`` with the master's address (where a child of the master dials it) for None."""
    return tuple((old, name, address if to is None else to, listen) for old, name, to, listen in table)


class Whereabouts:
    """Where a node joins the tree: at its configured parent as its configured slot name
    (``home``), or where MOVE sent it (``away`` until it goes home again); and where the
    last MOVE sent every host, by where it listens, so that a host that restarts and dials
    its configured parent is sent on to its place (``admit``)."""

    def __init__(self, address: str | None, name: str | None):
        self.home = (address, name)
        self.address, self.name = address, name
        self.away = False
        self.table: dict[str, tuple[str | None, str]] = {}

    def go(self, address: str, name: str) -> None:
        """Join at ``address`` as ``name``: where MOVE (or a parent that passed it on) says."""
        self.address, self.name = address, name
        self.away = True

    def go_home(self) -> None:
        """The tree that moved this node is gone (its master restarted with its configured
        plan): join where configured, and send no host on where that tree had put it."""
        self.address, self.name = self.home
        self.away = False
        self.table = {}

    def remember(self, table: tuple[MoveEntry, ...]) -> None:
        self.table = {listen: (to, name) for _, name, to, listen in table if listen is not None}

    def admit(self, hello: Hello, listen: str | None, children: Collection[str]) -> Hello:
        """A child's ``hello`` (it listens at ``listen``), as this parent takes it: with the
        name MOVE gave its host, if that is one of ``children``; ``JoinRefused`` with where
        to go if MOVE put that host under another parent."""
        moved = None if listen is None else self.table.get(listen)
        if moved is None:
            return hello
        to, name = moved
        if name not in children and to is not None:
            raise JoinRefused(f"the tree moved the host at {listen}: it joins {to} as {name}",
                              retry=True, to=(to, name))
        return dataclasses.replace(hello, name=name)
