"""WELCOME: what a parent tells a child of its place and of what the tree runs, and what
the child makes of it (``Membership`` sends and takes them)."""

from __future__ import annotations

from ...coding.plan import PEER_SCHEMES, Tree
from ...errors import JoinRefused, ProtocolError
from ...protocol.messages import Welcome
from ...schemes import Place
from ..steps import StepEngine


def welcome_for(place: Place, k: int, engine: StepEngine, job: str, local_processes: int) -> Welcome:
    """The WELCOME of child slot ``k`` of the node at ``place``."""
    total, dtype = engine.tree_vector or (None, None)
    return Welcome(place.tree.children(place.name)[k], place.layer + 1, place.tree.fanout,
                   place.tree.stragglers, place.code_kind, place.chunk_bytes, place.scheme,
                   engine.tree_step, total, dtype, job, local_processes,
                   place.beyond_s, place.patience, place.spread_sum)


def not_in_place(held: Place, tree: Tree, scheme: str) -> str | None:
    """Why a node at ``held`` cannot run ``scheme`` on ``tree`` where it is (the hosts must
    move: MOVE, ``Membership.move``), or None: another fanout, or to or from rar or spread,
    whose ring and peers are links made as the hosts join."""
    if tree.fanout != held.tree.fanout:
        return f"the parent's tree {tree} differs from the one this node joined"
    if scheme != held.scheme and {scheme, held.scheme} & set(PEER_SCHEMES):
        return f"the parent's scheme {scheme} differs from the one this node joined ({held.scheme})"
    return None


def welcomed_place(msg: Welcome, held: Place | None, listening: bool, local_processes: int) -> Place:
    """The place a WELCOME gives a node that holds ``held`` (None: none yet).

    ``ProtocolError`` if it is not the place it holds (another slot, or a tree of another
    shape, or a scheme with peers that is not the one it joined: the link closes and the
    node dials again after a pause: a broken or hostile peer at the parent's address must
    not stop it for good); what the tree runs there may differ otherwise (the master
    re-planned: ``--plan auto``, or restarted with another plan).
    ``JoinRefused`` if this node's configuration cannot take the place (no --listen where
    children or a ring predecessor must reach it): like a REFUSE for good, and as trusted
    (with a secret, only an authenticated parent welcomes), it stops the node instead of
    joining and leaving every few seconds."""
    tree = msg.tree
    moved = None if held is None else not_in_place(held, tree, msg.scheme)
    if moved:
        raise ProtocolError(moved)
    if held is not None and msg.name != held.name:
        raise ProtocolError(f"the parent gave this node slot {msg.name}, but it is {held.name}")
    place = Place(msg.name, msg.layer, tree, msg.scheme, msg.code, msg.chunk_bytes,
                  None if held is None else held.ring, msg.beyond_s, msg.patience,
                  msg.spread_sum)
    if place.scheme in PEER_SCHEMES and not listening:
        raise JoinRefused(f"{place.label} takes pieces from its peers (--scheme "
                          f"{place.scheme}) and must accept them: start it with --listen")
    if place.fanout and not listening:
        raise JoinRefused(f"{place.label} is at layer {place.layer} of {tree.layers} and "
                          "must accept children: start it with --listen")
    if msg.local_processes != local_processes:
        raise JoinRefused(f"{place.label} runs --local-processes {local_processes}, but "
                          f"the tree runs {msg.local_processes} on every host (the master's "
                          "--local-processes): start it with the same")
    return place
