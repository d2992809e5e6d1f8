"""crnetd, one host of the tree, in rooms that talk through small public interfaces.

Read in this order to follow one chunk from a child's socket to the training
process's result (``cr``; ``rar`` goes through ``ring_allreduce.py`` instead):

1. ``crnet/transport.py``     bytes -> frames (``wire.FrameReader``) -> typed messages
                              (``messages.parse``); the payload lands where the link says.
2. ``crnet/node/links.py``    ``ChildLink``: a CHUNK from a child goes to the step engine.
3. ``crnet/node/engine.py``   the step: open (its deadline starts), or decided already
                              (late: dropped, or the child catches up); the scheme gets it.
4. ``crnet/schemes/coded_reduce.py``  where the chunk lands, the decode from the fastest
                              n-s children, up to the parent or, at the master, down to
                              every child; complete -> ``Ports.resolved``.
5. ``crnet/node/engine.py`` ``resolved``/``fail`` and ``links.ClientLink._answer``: the
                              outcome is kept and every waiting training process answered.

The rooms:

- ``lifecycle.py``   ``Node``: listeners, signals, ordered shutdown; ``Settings``; ``run_node``.
- ``membership.py``  join: place in the tree (``JoinState``), child slots, assignment,
                     reconnecting to the parent and the ring successor (``dial.py``).
- ``engine.py``      ``StepEngine``: per-step deadlines, outcomes, catch-up, waiters; it is
                     the ``Ports`` a scheme (``crnet.schemes``) sends through.
- ``neighbours.py``  the links themselves: parent, child slots, ring neighbours.
- ``links.py``       what each kind of peer may send, dispatched to membership or engine.

Imports go one way: lifecycle -> links -> membership -> engine -> neighbours.
"""

from .lifecycle import Node, Settings, run_node

__all__ = ["Node", "Settings", "run_node"]
