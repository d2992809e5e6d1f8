"""The tree changes its plan between jobs (``--plan auto``; ``replan.py`` decides which).

- ``replan``: the same hosts in the same places run another scheme among cr, gc and tree,
  or other stragglers: every child gets its WELCOME of the new plan, then its ASSIGN,
  before the JOB that starts the job (one link: in that order), and passes both down the
  same way (``Membership.welcomed``).
- ``move``: another fanout or depth, or rar or spread (their rings and meshes are made as
  hosts join): MOVE goes down the tree with every host's new place (``moves.py``), every
  host leaves its parent and joins its new one as a host that just started would
  (``moved``), and the plan is made once all have joined, as at the start.
"""

from __future__ import annotations

import logging

from ...coding.plan import PEER_SCHEMES
from ...protocol.messages import Move
from ...schemes import Place
from ..peers.mesh import Mesh
from .membership import JoinState, Membership
from .moves import move_table, placement, with_master

log = logging.getLogger("crnet.node")


def replan(m: Membership, place: Place) -> None:
    """The master: the tree runs ``place`` (its hosts where they are) from the next job on."""
    assert m.place is not None and place.tree.fanout == m.place.tree.fanout
    m.place = place
    m.engine.stats.measured.clear()
    m.welcome_children()
    if m.allocation is not None:   # (else not every worker joined yet: they get it as they do)
        m.plan_and_assign("re-planned")


def move(m: Membership, place: Place) -> bool:
    """The master: every host moves to its place in ``place``'s tree. False (nothing
    changes) if not every worker has joined, or too few hosts listen for the places that
    must accept links (parents; every host with peers)."""
    assert m.place is not None and m.place.is_master
    if m.allocation is None:
        return False
    addresses = dict(Mesh.below(m.place.tree, "", m.neighbours.slots))
    where = placement(m.place.tree, place.tree, addresses, place.scheme in PEER_SCHEMES)
    if where is None:
        log.info("plan auto: %s needs every host that must accept links to listen "
                 "(--listen): not moved", place.scheme)
        return False
    table = move_table(where, place.tree, addresses)
    m.whereabouts.remember(table)
    m.drop_children(Move(table))
    m.take_place(place, JoinState.WELCOMED)
    log.info("the tree takes another shape: %s, fanout %s, stragglers %s; every host joins "
             "its new place", place.scheme, ",".join(map(str, place.tree.fanout)),
             ",".join(map(str, place.tree.stragglers)))
    return True


def moved(m: Membership, msg: Move) -> None:
    """A node, told MOVE by its parent: its children get it first; then it leaves its
    parent and children and joins its new parent."""
    assert m.place is not None
    table = msg.moves
    if m.place.layer == 1:   # the master: where this node dials it
        table = with_master(table, m.parent_address)
    m.whereabouts.remember(table)
    mine = next(((to, name) for old, name, to, _ in table if old == m.place.name), None)
    m.drop_children(Move(table))
    if mine is None or mine[0] is None:
        log.error("MOVE has no place for %s: it joins its configured parent again", m.label)
        m.rejoin()
        return
    log.info("the tree takes another shape: %s joins %s as %s", m.label, mine[0], mine[1])
    m.rejoin((mine[0], mine[1]))
