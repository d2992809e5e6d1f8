"""crnetd, one host of the tree, in rooms that talk through small public interfaces.

Read these four files in this order, each once, to follow one chunk from a child's
socket to the training process's result (``cr``; ``rar``'s segments take the same
path to ``ring_allreduce.py``):

1. ``crnet/transport.py``   bytes -> frames (``wire.FrameReader``) -> typed messages
                            (``messages.parse``); a payload lands where the link says.
2. ``crnet/node/links/``    ``child.py``'s ``ChildLink``: a CHUNK from a child goes to the step
                            engine; ``client.py``'s ``ClientLink`` (its steps in
                            ``client_steps.py``): a training process submits its vector and
                            ``watch``es the step; its answer is written when the outcome comes.
3. ``crnet/node/engine.py`` the step is open (its deadline runs) or decided (a late chunk
                            is dropped, or the child catches up); the scheme gets it. When the
                            scheme reports the outcome (``resolved``/``fail``), it is kept and
                            everyone watching the step is answered.
4. ``crnet/schemes/coded_reduce.py``  the chunk's receive buffer, the decode from the
                            fastest n-s children, up to the parent or, at the master, down
                            to every child as RESULT; the whole vector -> ``Ports.resolved``.

The rooms:

- ``lifecycle.py``   ``Node``: listeners, signals, ordered shutdown; ``Settings``; ``run_node``.
- ``membership.py``  join: place in the tree (``JoinState``), child slots, assignment,
                     reconnecting to the parent and the ring successor (``dial.py``).
- ``engine.py``      ``StepEngine``: per-step deadlines, outcomes, catch-up, waiters; it is
                     the ``Ports`` a scheme (``crnet.schemes``) sends through.
- ``neighbours.py``  the links themselves: parent, child slots, ring neighbours.
- ``links/``         each kind of peer's link: a state machine (``links/machine.py``) whose
                     per-state table says what it may send and who handles it.
- ``local.py``       this host's training processes: seats, their sum, their outputs lent.
- ``rooms.py``       broadcasts, barriers, status: built beside membership, told by its signals.
- ``signal.py``      ``Signal``: how a room hears of another (connect returns the disconnect).

Imports go one way: lifecycle -> links -> local, rooms -> membership -> engine -> neighbours;
status and metrics read narrow views (``StatusView``, ``NodeView``), built by ``Node``.
"""

from .lifecycle import Node, Settings, run_node

__all__ = ["Node", "Settings", "run_node"]
