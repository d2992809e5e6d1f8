"""crnetd, one host of the tree, in rooms that talk through small public interfaces.

A chunk's path through the daemon, from a child's socket to the training process's
result, is six files read once each, in order: docs/development.md, "Following a chunk", lists
them function by function, and ``tests/test_chunk_path.py`` checks that list against a
real chunk.

The rooms:

- ``lifecycle.py``   ``Node``: listeners, signals, ordered shutdown; ``Settings``; ``run_node``.
- ``membership.py``  join: place in the tree (``JoinState``), child slots, assignment,
                     reconnecting to the parent and the ring successor (``dial.py``).
- ``steps/``         the step core: ``engine.py`` the gate between the links and the scheme
                     (``crnet.schemes``), and its rooms: the window, the deadlines (the stall
                     inspector), the decisions and the outcomes kept, lending, the sends.
                     A scheme gets narrow ports (sends, its steps, memory), never the engine.
- ``neighbours.py``  the links themselves: parent, child slots, ring neighbours.
- ``links/``         each kind of peer's link: a state machine (``links/machine.py``) whose
                     per-state table says what it may send and who handles it.
- ``local.py``       this host's training processes: seats, their sum, their outputs lent.
- ``rooms.py``       broadcasts, barriers, status: built beside membership, told by its signals.
- ``signal.py``      ``Signal``: how a room hears of another (connect returns the disconnect).

Imports go one way: lifecycle -> links -> local, rooms -> membership -> steps -> neighbours;
status and metrics read narrow views (``StatusView``, ``NodeView``), built by ``Node``.
"""

from .lifecycle import Node, Settings, run_node

__all__ = ["Node", "Settings", "run_node"]
