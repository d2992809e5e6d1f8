"""crnetd, one host of the tree, in rooms that talk through small public interfaces.

A chunk's path through the daemon, from a child's socket to the training process's
result, is listed file by file in docs/development.md, "Following a chunk", and
``tests/tree/test_chunk_path.py`` checks that list against a real chunk from a real leaf.

The rooms, a folder each where they are several files:

- ``lifecycle.py``   ``Node``: listeners, signals, ordered shutdown; ``Settings``; ``run_node``.
- ``admission/``     accepted connections until through their handshake: the doorway's caps,
                     the authentication guard, TLS.
- ``join/``          a node's place in the tree (``JoinState``), child slots, its share,
                     WELCOME, the tree's moves and re-plans between jobs; ``dial.py`` keeps a
                     dialed link up.
- ``peers/``         the links beside the tree: the mesh, ranks confirmed, --tls-names.
- ``steps/``         the step core: ``engine.py`` the gate between the links and the scheme
                     (``crnet.schemes``), and its rooms: the window, the deadlines (the stall
                     inspector), the decisions and the outcomes kept, lending.
                     A scheme gets narrow ports (sends, its steps, memory), never the engine.
- ``collectives/``   the job's: which job is attached, broadcasts, barriers, state requests.
- ``observe/``       crnet status, the measured section and probe, metrics, systemd, logs.
- ``links/``         each kind of peer's link: a state machine (``links/machine.py``) whose
                     per-state table says what it may send and who handles it.
- ``neighbours.py``  the links themselves: parent, child slots, peers.
- ``local.py``       this host's training processes: seats, their sum, their outputs lent.
- ``rooms.py``       broadcasts, barriers, status: built beside membership, told by its signals.
- ``signal.py``      ``Signal``: how a room hears of another (connect returns the disconnect).

Imports go one way: lifecycle -> links -> local, rooms -> join -> steps -> neighbours;
status and metrics read narrow views (``StatusView``, ``NodeView``), built by ``Node``.
"""

from .lifecycle import Node, Settings, run_node

__all__ = ["Node", "Settings", "run_node"]
