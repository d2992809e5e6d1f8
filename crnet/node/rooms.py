"""The rooms beside membership: broadcasts, barriers and ``crnet status``.

``lifecycle.Node`` builds them here (as the tests do): each from what it reads, and
each told of the join through membership's signals (a child gone, the parent up or
down, a new job), never through membership itself. The links get the rooms they
hand messages to; nothing holds all of them but the node.
"""

from __future__ import annotations

from dataclasses import dataclass

from .collectives.barriers import Barriers
from .collectives.broadcasts import Broadcasts
from .join.membership import JoinState, Membership
from .observe.measure import MeasuredView
from .observe.probe import Prober
from .observe.status import StatusService, StatusView

LIVENESS = 2.0    # seconds a child has to answer when another node asks for its slot


@dataclass(frozen=True)
class Rooms:
    broadcasts: Broadcasts
    barriers: Barriers
    status: StatusService

    @classmethod
    def beside(cls, membership: Membership) -> Rooms:
        m = membership
        nb, engine = m.neighbours, m.engine
        broadcasts = Broadcasts(nb, lambda: m.place, engine.settings.max_vector_bytes,
                                m.jobs.below, m.jobs.here, window=engine.settings.broadcast_window,
                                tree_step=lambda: engine.tree_step)
        barriers = Barriers(nb, lambda: m.place, m.jobs.below)
        status = StatusService(StatusView(
            place=lambda: m.place, assigned=lambda: m.state is JoinState.ASSIGNED,
            listen_address=lambda: m.listen_address, parent_up=lambda: nb.parent is not None,
            slots=lambda: nb.slots, tree_step=lambda: engine.tree_step, stats=engine.stats,
            host_id=m.host_id, measured=MeasuredView(
                engine.stats, nb, place=lambda: m.place, samples=lambda: m.samples,
                local_samples=lambda: _local_samples(m), processes=m.local_processes,
                tree_vector=lambda: engine.tree_vector).section,
            prober=Prober(nb, lambda: m.place, assigned=lambda: m.state is JoinState.ASSIGNED,
                          attached=m.jobs.any_attached)))
        # In the order membership did it before it knew none of them: broadcasts first.
        m.on_child_lost.connect(broadcasts.child_lost)
        m.on_child_lost.connect(barriers.child_lost)
        m.on_job_reset.connect(lambda _: broadcasts.new_job())
        m.on_job_reset.connect(lambda _: barriers.new_job())
        m.on_parent_up.connect(lambda _: barriers.parent_up())
        m.on_parent_up.connect(lambda _: broadcasts.states.parent_up())
        m.on_job.connect(lambda _: barriers.recount())           # whose processes count changed
        m.jobs.on_counts.connect(lambda _: barriers.recount())
        m.jobs.on_counts.connect(lambda _: broadcasts.states.counts_changed())
        m.on_parent_down.connect(lambda _: broadcasts.parent_lost())
        broadcasts.state_step.connect(engine.learn)
        m.on_slot_contested.connect(lambda held: status.probe(
            *held, LIVENESS, lambda: m.drop_child(*held)))
        return cls(broadcasts, barriers, status)


def _local_samples(m: Membership) -> int | None:
    """This host's share of the batch, once it has one."""
    if m.allocation is None or m.place is None or m.place.name not in m.allocation:
        return None
    return sum(stop - start for start, stop, _ in m.allocation[m.place.name].local)
