"""Membership: a node's place in the tree, its child slots, its share of the data.

Join, as the parent sees it: a child says HELLO; it gets a free slot (or the slot
its ``--name`` held before, or else the slot its host id held before: a restarted
host gets its share back without ``--name``: ``host_slots.py``) and WELCOME
with the tree; it reports how many workers of its subtree have JOINED. Once all N
have, the master computes ``crnet.coding.plan`` and ASSIGNs every subtree its allocation,
down the tree (``shares.py``: who gets which part). Between jobs the master may re-plan
(``--plan auto``: ``replan``, ``move``): WELCOME and ASSIGN again, or MOVE to another shape.

Join, as the child sees it (``start``): connect, HELLO, WELCOME, then ASSIGN;
when the parent goes away, the steps under way here fail and the node reconnects
with backoff (``dial.py``) until the parent is back. A ring member (``--scheme
rar``: the workers and the master) also keeps a link to its ring successor the same way, and a
spread host one to every other host (``node/peers/mesh.py``).

The state is explicit (``JoinState``); the step engine is told when the node has
its share (``engine.start``) and when children or the parent come and go. Everyone
else (broadcasts, barriers, the training processes' links, systemd) hears of it
through membership's signals (``Signal``): ``rooms.py`` connects broadcasts and
barriers, each training process's link connects itself (and disconnects when it goes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from collections import Counter
from collections.abc import Callable

from ...coding.plan import PEER_SCHEMES
from ...errors import JoinRefused, ProtocolError
from ...peer_text import shown
from ...protocol.allocation import NodeShare, pack_allocation, parse_allocation
from ...protocol.fields import check_address
from ...protocol.messages import Assign, Hello, Job, Joined, Move, PeerHello, RingPlace, Welcome
from ...protocol.transport import Connection
from ...schemes import Place
from ..collectives.jobs import JobCounts
from ..neighbours import ChildSlot, Neighbours
from ..peers import identity as peer_identity
from ..peers.mesh import Mesh, PeerDialer
from ..signal import Signal
from ..steps import StepEngine, vouched, vouched_floor
from .dial import Dialer, keep_connected, supervised
from .host_slots import claim_slot, reached_at, slot_for
from .moves import Whereabouts, move_table, placement, with_master
from .shares import (
    child_ring,
    plan_allocation,
    process_assignment,
    subtree_allocation,
    subtree_workers,
    with_masses,
)
from .welcome import welcome_for, welcomed_place

__all__ = ["JoinState", "Membership", "subtree_workers"]

log = logging.getLogger("crnet.node")


class JoinState(enum.Enum):
    JOINING = "joining"        # connecting to the parent, or waiting for its WELCOME
    WELCOMED = "welcomed"      # has its place in the tree; waiting for its share (ASSIGN)
    ASSIGNED = "assigned"      # has its share: steps run


class Membership:
    def __init__(self, engine: StepEngine, neighbours: Neighbours, *, stop: Callable[[int], None],
                 place: Place | None = None, samples: int | None = None,
                 name: str | None = None, dial_parent: Dialer | None = None,
                 dial_peer: PeerDialer | None = None,
                 resolve_timeout: float | None = None, host_id: str | None = None,
                 parent_address: str | None = None, local_processes: int = 1, names: bool = False):
        """The master passes its ``place`` and ``samples``; a node ``dial_parent``, the
        ``parent_address`` (host:port) it dials, the slot ``name`` it wants, and learns both.
        ``dial_peer(address, peer)`` dials a ring successor or spread host (``None``: the
        master, at the parent's address). A node whose parent's host name does not resolve
        for ``resolve_timeout`` s exits 2. ``local_processes``: every host's (the master's),
        which bounds what a child may say of the processes below it (``node/collectives/jobs.py``).
        ``names``: --tls-names (a child's certificate names its host id: ``node/peers/identity.py``)."""
        self.resolve_timeout = resolve_timeout
        self.engine = engine
        self.neighbours = neighbours
        self.place = place
        self.samples = samples
        self.state = JoinState.WELCOMED if place is not None else JoinState.JOINING
        self.allocation: dict[str, NodeShare] | None = None   # this subtree's shares
        self.listen_address: str | None = None                 # where this node accepts children
        self.job = ""                                          # the training job the tree runs
        self.local_processes = local_processes
        self.jobs = JobCounts(neighbours, lambda: self.job,   # processes attached, by job
                              lambda: self.place is not None and self.place.is_master,
                              self._start_job, lambda: self.engine.tree_step >= 0,
                              lambda: self.state is JoinState.ASSIGNED)
        # The master, --plan auto (replan.py): called instead of ``run_job`` for a new job;
        # it may ``replan`` first, and then runs it.
        self.before_job: Callable[[str], None] | None = None
        # Who hears what (lifecycle.Node connects them; each listener keeps its disconnect):
        self.on_assigned: Signal[None] = Signal()   # this node holds its share (again)
        self.on_change: Signal[None] = Signal()     # the join moved (notify.py's STATUS)
        self.on_job: Signal[str] = Signal()         # the tree runs another job now
        self.on_job_reset: Signal[str] = Signal()   # ... and the previous one's state is moot
        self.on_child_lost: Signal[int] = Signal()  # child slot k is empty again
        self.on_slot_contested: Signal[tuple[int, Connection]] = Signal()   # is its holder alive?
        self.on_parent_up: Signal[Connection] = Signal()
        self.on_parent_down: Signal[str] = Signal()   # why (the parent, or the master, lost)
        self._stop = stop
        self.host_id = host_id
        self.hosts: dict[str, int] = {}    # host id -> the child slot it held (this run)
        self._dial_parent = dial_parent
        self._dial_peer = dial_peer
        self._names = names
        self.mesh = self._new_mesh()
        self.whereabouts = Whereabouts(parent_address, name)   # where it joins (MOVE)
        self._joined_reported = -1
        self._closing = False
        self._tasks: list[asyncio.Task] = []
        if place is not None:
            self._size_slots()

    @property
    def label(self) -> str:
        return "node (joining)" if self.place is None else self.place.label

    def assignment(self, process: int = 0, processes: int = 1) -> dict | None:
        """This node's share, as its training process ``process`` of ``processes`` sees it
        (``Client.assignment``): the host's share cut in ``processes`` parts."""
        if self.allocation is None or self.place is None or self.samples is None:
            return None
        return process_assignment(self.place, self.allocation[self.place.name], self.samples,
                                  process, processes)

    def close(self) -> None:
        self._closing = True    # the links closing now are the shutdown's: nothing to report
        for task in self._tasks:
            task.cancel()
        self.mesh.close()

    # ---------------------------------------------------------------- jobs
    def join_job(self, name: str) -> bool:
        """A training process of job ``name`` arrived here (``jobs.attached`` counted it):
        True if the tree runs that job (now). Else the master is asked to start it, which
        it does once no process of the running job is attached anywhere (``on_job`` tells
        when; ``jobs.on_refused`` if it cannot)."""
        if not name or name == self.job:
            return True
        if self.place is not None and self.place.is_master:
            self.jobs.ask(name)
            return name == self.job
        self.jobs.report()   # a request, with this host's processes of the job
        return False

    def child_job(self, k: int, msg: Job) -> None:
        """Child ``k``'s processes, by job (``JobCounts.from_child``)."""
        assert self.place is not None
        self.jobs.from_child(k, msg, subtree_workers(self.place.tree, self.place.layer + 1)
                             * self.local_processes)

    def parent_job(self, msg: Job) -> None:
        """The parent's JOB: the job the tree runs (with ``refused``: one that cannot)."""
        if msg.refused:
            self.jobs.refused(msg)
        self.run_job(msg.name)

    def _start_job(self, name: str) -> None:
        if self.before_job is None or name == self.job:
            self.run_job(name)
        else:
            self.before_job(name)

    @property
    def parent_address(self) -> str | None:   # host:port where it dials its parent (MOVE may move it)
        return self.whereabouts.address

    def _plan_and_assign(self, why: str) -> None:
        """The master, every worker joined (``why``): the plan; every subtree's share down."""
        assert self.place is not None and self.samples is not None
        self.allocation, said = plan_allocation(self.place.tree, self.samples, self.place.code_kind)
        log.info("%s: %s", why, said)
        self._assigned()

    def _take_place(self, place: Place | None, state: JoinState) -> None:
        """MOVE: the place is ``place`` (None: it joins anew); share, peers, windows go."""
        self.mesh.leave()
        self.mesh = self._new_mesh()
        self.engine.peers_moved()
        self.place, self.allocation, self.state = place, None, state
        if place is not None:
            self._size_slots()
        self._joined_reported = -1
        self.engine.stats.measured.clear()

    def _drop_children(self, move: Move | None = None) -> None:
        """Close every child link (after ``move``, if given: the children move too) and
        forget the slots: the children join again, where MOVE says or as they can."""
        for k, slot in enumerate(self.neighbours.slots):
            link = slot.link
            if link is not None:
                if move is not None:
                    link.send(move)
                self.child_lost(k, link, said=False)
                link.close()
        self.neighbours.slots = []
        self.hosts = {}

    def _new_mesh(self) -> Mesh:
        engine = self.engine
        return Mesh(self.neighbours, self._dial_peer, engine.peer_lost,
                    engine.peer_unreachable, self._names, engine.peer_disowned,
                    stall_after=engine.settings.stall_after)

    def _welcome_children(self) -> None:
        for k, slot in enumerate(self.neighbours.slots):
            slot.assigned = False
            if slot.link is not None:
                slot.link.send(self._welcome(k))

    def run_job(self, name: str) -> None:
        """The tree runs job ``name`` from now on (the master decided): drop the previous
        job's steps, tell the subtree, and the processes waiting for it."""
        if name == self.job:
            return
        fresh = not self.job and self.engine.tree_step < 0
        self.job = name
        if not fresh:   # fresh daemons (no job, no step decided) have nothing to drop: steps
            self.engine.new_job(name)     # under way there belong to processes that
            self.on_job_reset.emit(name)  # joined whatever job runs, i.e. this one
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(Job(name))
        self.on_job.emit(name)
        self.jobs.report()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._tasks, *self.mesh.tasks, return_exceptions=True)

    # ---------------------------------------------------------------- re-plans (--plan auto)
    # Between jobs the tree may change its plan (``replan.py`` decides which):
    # - ``replan``: the same hosts in the same places run another scheme among cr, gc and
    #   tree, or other stragglers: every child gets its WELCOME of the new plan, then its
    #   ASSIGN, before the JOB that starts the job (one link: in that order), and passes both
    #   down the same way (``welcomed``).
    # - ``move``: another fanout or depth, or rar or spread (their rings and meshes are made
    #   as hosts join): MOVE goes down the tree with every host's new place (``moves.py``),
    #   every host leaves its parent and joins its new one as a host that just started would
    #   (``moved``), and the plan is made once all have joined, as at the start.
    def replan(self, place: Place) -> None:
        """The master: the tree runs ``place`` (its hosts where they are) from the next job on."""
        assert self.place is not None and place.tree.fanout == self.place.tree.fanout
        self.place = place
        self.engine.stats.measured.clear()
        self._welcome_children()
        if self.allocation is not None:   # (else not every worker joined yet: they get it as they do)
            self._plan_and_assign("re-planned")


    def move(self, place: Place) -> bool:
        """The master: every host moves to its place in ``place``'s tree. False (nothing
        changes) if not every worker has joined, or too few hosts listen for the places that
        must accept links (parents; every host with peers)."""
        assert self.place is not None and self.place.is_master
        if self.allocation is None:
            return False
        addresses = dict(Mesh.below(self.place.tree, "", self.neighbours.slots))
        where = placement(self.place.tree, place.tree, addresses, place.scheme in PEER_SCHEMES)
        if where is None:
            log.info("plan auto: %s needs every host that must accept links to listen "
                     "(--listen): not moved", place.scheme)
            return False
        table = move_table(where, place.tree, addresses)
        self.whereabouts.remember(table)
        self._drop_children(Move(table))
        self._take_place(place, JoinState.WELCOMED)
        log.info("the tree takes another shape: %s, fanout %s, stragglers %s; every host joins "
                 "its new place", place.scheme, ",".join(map(str, place.tree.fanout)),
                 ",".join(map(str, place.tree.stragglers)))
        return True


    def moved(self, msg: Move) -> None:
        """A node, told MOVE by its parent: its children get it first; then it leaves its
        parent and children and joins its new parent."""
        assert self.place is not None
        table = msg.moves
        if self.place.layer == 1:   # the master: where this node dials it
            table = with_master(table, self.parent_address)
        self.whereabouts.remember(table)
        mine = next(((to, name) for old, name, to, _ in table if old == self.place.name), None)
        self._drop_children(Move(table))
        if mine is None or mine[0] is None:
            log.error("MOVE has no place for %s: it joins its configured parent again", self.label)
            self.rejoin()
            return
        log.info("the tree takes another shape: %s joins %s as %s", self.label, mine[0], mine[1])
        self.rejoin((mine[0], mine[1]))

    # ---------------------------------------------------------------- parent side
    def child_hello(self, conn: Connection, hello: Hello) -> int:
        """Admit a child: its slot index. ``JoinRefused`` says why not (the link
        sends REFUSE and closes)."""
        place = self.place
        bad = None if hello.listen is None else check_address(hello.listen)
        if bad:   # its ring predecessor or its peers would dial it there (mesh.py)
            raise JoinRefused(f"HELLO: the address it listens at is no good: {bad}")
        bad = peer_identity.child_named(conn.transport, hello.host) if self.mesh.names else None
        if bad:   # the host id it reports up is its certificate's (peer_identity.py)
            raise JoinRefused(f"HELLO: {bad}")
        listen = reached_at(hello.listen, conn.label)
        children = [] if place is None else place.tree.children(place.name)
        hello = self.whereabouts.admit(hello, listen, children)   # a host MOVE placed
        if place is None:
            raise JoinRefused(f"{self.label} has not joined the tree yet", retry=True)
        k = slot_for(place, self.neighbours.slots, self.hosts, hello, conn,
                     lambda k, held: self.on_slot_contested.emit((k, held)))
        claim_slot(self.hosts, hello.host, k, hello.name is not None)
        self.neighbours.slots[k] = ChildSlot(link=conn, address=listen, host=hello.host,
                                             missed_through=self.engine.newest_step,
                                             peer=conn.label)
        conn.send(self._welcome(k))
        log.info("child %s joined from %s", children[k], conn.label)
        return k

    def _welcome(self, k: int) -> Welcome:
        assert self.place is not None
        return welcome_for(self.place, k, self.engine, self.job, self.local_processes)

    def child_joined(self, k: int, msg: Joined) -> None:
        """Child ``k`` counts the workers of its subtree that joined. More than its subtree
        holds is a ``ProtocolError`` (that link closes): nothing is counted."""
        assert self.place is not None
        most = subtree_workers(self.place.tree, self.place.layer + 1)
        if msg.workers > most:
            child = self.place.tree.children(self.place.name)[k]
            raise ProtocolError(f"JOINED: child {child} counts {msg.workers} workers, but its "
                                f"subtree holds {most}")
        slot = self.neighbours.slots[k]
        slot.workers = msg.workers
        # spread's peers, and where hosts move (MOVE); with --tls-names their host ids
        slot.below, slot.hosts = dict(msg.peers), dict(msg.hosts)
        # Kept, not learned now: a node takes its children's word for where the tree is,
        # and which job it runs, only when it gets its share (``_assigned``: a restarted
        # master, when all have joined), and then only as far as s + 1 of them vouch for it
        # (``vouched``, ``_children_job``).
        slot.tree_step, slot.job, slot.vector = msg.tree_step, msg.job, msg.vector
        self._report_joined()
        if self.allocation is not None and not slot.assigned and msg.workers:
            self._assign_child(k)

    def drop_child(self, k: int, conn: Connection) -> None:
        """Child ``k``'s ``conn`` failed a liveness check while another node asked for its
        slot: close it (the other takes the slot when it tries again)."""
        if self.neighbours.slots[k].link is conn:
            assert self.place is not None
            log.warning("child %s did not answer while a node asked for its slot; closing its "
                        "old connection from %s", self.place.tree.children(self.place.name)[k],
                        conn.label)
            self.child_lost(k, conn)
            conn.close()

    def child_lost(self, k: int, conn: Connection, said: bool = True) -> None:
        """Child ``k``'s link ``conn`` is gone (``said``: tell the log and the parent; not
        when this node drops its children itself, to move)."""
        slots = self.neighbours.slots
        if k >= len(slots) or slots[k].link is not conn:
            return
        slots[k] = slots[k].vacated()
        self.on_child_lost.emit(k)
        self.jobs.child_lost(k)
        assert self.place is not None
        if said and not self._closing:   # at shutdown this node closes its links itself
            log.warning("child %s disconnected", self.place.tree.children(self.place.name)[k])
        self.engine.child_lost(k)
        if said:
            self._report_joined()

    def peer_hello(self, conn: Connection, hello: PeerHello, confirmed: Callable[[], None]) -> None:
        """A ring predecessor or spread host: accepted (``node/peers/mesh.py``), ``confirmed()`` later."""
        self.mesh.accept(conn, hello, self.place, self.label, confirmed)

    def _report_joined(self) -> None:
        place = self.place
        assert place is not None
        slots = self.neighbours.slots
        count = (0 if place.is_master else 1) + sum(s.workers for s in slots if s.link)
        if count == self._joined_reported or self._closing:
            return
        before, self._joined_reported = self._joined_reported, count
        self._changed()
        if not place.is_master:
            below = Mesh.below(place.tree, place.name, slots)
            hosts = peer_identity.below(place.tree, place.name, slots) if self.mesh.names else ()
            tree_step = max(self.engine.tree_step, self._children_claim())
            total, dtype = self.engine.tree_vector or self._children_vector() or (None, None)
            self.neighbours.to_parent(Joined(count, tree_step, self.job, below, hosts, total, dtype))
            return
        log.info("%d/%d workers %s", count, place.tree.workers,   # (fewer: links lost, none joined)
                 f"connected ({before - count} left)" if count < before else "joined")
        if count == place.tree.workers and self.allocation is None:
            self._plan_and_assign("all workers joined")

    def _children_claim(self) -> int:
        """Where the tree is, as this node's children vouch for it (-1: they do not know)."""
        place = self.place
        if place is None or place.is_leaf:
            return -1
        claims = [slot.tree_step for slot in self.neighbours.slots if slot.link is not None]
        return vouched(claims, place.tree.stragglers[place.layer], self.engine.settings.window)

    def _children_vector(self) -> tuple[int, str] | None:
        """The tree's vector layout as s + 1 of this node's children say it (None if fewer
        agree). Not one child's word: at a restarted master, which knows no layout until a
        step resolves, spread's pieces in a layout one secret holder chose would begin every
        step in it, and the honest hosts' pieces would not fit (the authenticated fuzzer
        with master restarts stalled so: issue 54)."""
        place = self.place
        if place is None or place.is_leaf:
            return None
        said = Counter(slot.vector for slot in self.neighbours.slots
                       if slot.link is not None and slot.vector is not None)
        vector, n = max(said.items(), key=lambda kv: kv[1], default=(None, 0))
        return vector if n > place.tree.stragglers[place.layer] else None

    def _children_job(self) -> str:
        """The job s + 1 of this node's children say they run ("" if none: the unnamed job).
        Not one child's word: a child holding the secret would name a job of its own, and
        at a restarted master that job would begin with step 0 again, refusing every step
        of the processes of the job that ran (the authenticated fuzzer's JOINED found it)."""
        place = self.place
        assert place is not None
        said = Counter(slot.job for slot in self.neighbours.slots if slot.link is not None and slot.job)
        job, n = max(said.items(), key=lambda kv: kv[1], default=("", 0))
        return job if n > place.tree.stragglers[place.layer] else ""

    def _assigned(self) -> None:
        assert self.place is not None
        if self.place.is_master and not self.job and self.engine.tree_step < 0:
            self.job = self._children_job()   # a restarted master: the job its children run
        # A node that restarted resumes where its children are (the master: all of them
        # have joined now; a node's parent told it in WELCOME too). One that knows more
        # itself moves nothing back.
        vouched_for = self._children_claim()
        self.engine.learn(vouched_for, self._children_vector())
        if self.place.is_master:
            # The newest step s + 1 children say the master decided: a master that restarted
            # may have settled steps up to there before it died, which some hosts applied: it
            # never fails them tree-wide (they are lost: every host lacking one takes the
            # others' state). Not the newest any child claims: one holding the secret could
            # claim 10^6, and every failure in the window ahead would be lost for the whole
            # tree, the state taken from the one host not asking for it, its own (issue 54).
            # A step that only s hosts or fewer applied before the restart is failed for the
            # others now.
            claims = [slot.tree_step for slot in self.neighbours.slots if slot.link is not None]
            self.engine.decisions.settled_before = vouched_floor(
                claims, self.place.tree.stragglers[self.place.layer])
        self.state = JoinState.ASSIGNED
        if self.place.is_master and self.place.scheme == "rar" and self.place.ring is None:
            # The master is the ring's last member (ring_allreduce.py); it dials worker 0.
            slots = self.neighbours.slots
            ring = RingPlace(len(slots), len(slots) + 1, slots[0].address, slots[-1].address)
            self.place = dataclasses.replace(self.place, ring=ring)
            self.mesh.keep_successor(ring)
        if self.place.is_master and self.place.scheme == "spread":
            tree, slots = self.place.tree, self.neighbours.slots
            self.mesh.join(tree, "", Mesh.everyone(tree, slots), peer_identity.everyone(
                tree, slots, self.host_id or "") if self.mesh.names else ())
        self.place = with_masses(self.place, self.allocation)
        self.engine.start(self.place)
        for k, slot in enumerate(self.neighbours.slots):
            if slot.link is not None and slot.workers and not slot.assigned:
                self._assign_child(k)
        self.on_assigned.emit(None)
        if self.place.is_master:
            self.jobs.review()   # jobs children asked for before the tree was planned

    def _assign_child(self, k: int) -> None:
        assert self.place is not None and self.allocation is not None and self.samples is not None
        slots = self.neighbours.slots
        sub = subtree_allocation(self.allocation, self.place.tree.children(self.place.name)[k])
        ring = (child_ring(k, [slot.address for slot in slots]) if self.place.scheme == "rar"
                else None)
        link = slots[k].link
        assert link is not None
        slots[k].assigned = link.send(Assign(self.samples, ring, self.mesh.addresses, self.mesh.hosts),
                                      pack_allocation(sub))

    def _size_slots(self) -> None:
        """This node knows its place: one slot per child it will have."""
        assert self.place is not None
        if len(self.neighbours.slots) != self.place.fanout:
            self.neighbours.slots = [ChildSlot() for _ in range(self.place.fanout)]

    # ---------------------------------------------------------------- child side
    def start(self) -> None:
        """A node: join through the parent and stay joined (the master has no parent)."""
        if self._dial_parent is not None:
            self._tasks.append(supervised(keep_connected(
                "parent", self._dial_parent, hello=self._hello, up=self._parent_up,
                down=self._parent_down, refused=self._refused,
                moved=lambda address, name: self.rejoin((address, name)),
                unresolved=None if self.resolve_timeout is None else
                (self.resolve_timeout, lambda: self._stop(2))), "parent"))

    def _hello(self) -> Hello:
        name = self.whereabouts.name if self.place is None else self.place.name
        return Hello(name, self.listen_address, host=self.host_id)

    def _parent_up(self, conn: Connection) -> None:
        self.neighbours.parent = conn
        self.engine.parent_back()
        self._joined_reported = -1
        self._report_joined()
        self.on_parent_up.emit(conn)
        self.jobs.parent_up()

    def _parent_down(self, what: str) -> None:
        self.neighbours.parent = None
        self.engine.parent_lost(f"lost the connection to its {what}")
        self.on_parent_down.emit(what)
        log.warning("%s lost its %s; reconnecting", self.label, what)
        self._changed()

    def _changed(self) -> None:
        self.on_change.emit(None)

    def _refused(self, e: JoinRefused) -> bool:
        """The parent refused this node for good (with a cluster secret, only a parent that
        authenticated itself gets here: guard.py): its configuration is wrong, exit 2 (a
        restart would not help). Unless the tree had moved it (MOVE) and its new place is
        gone (a master restarted with its configured plan): it goes home (True: dial on)."""
        if self.whereabouts.away:
            log.warning("%s: the parent the tree moved it to refused it (%s); it joins its "
                        "configured parent again", self.label, shown(e.reason))
            self.rejoin()
            return True
        log.error("%s: the parent refused this node: %s", self.label, shown(e.reason))
        self._stop(2)
        return False

    def rejoin(self, to: tuple[str, str] | None = None) -> None:
        """Join the tree afresh at ``to`` (address, slot name), where MOVE says; None: where
        configured (the tree that moved it is gone). Its place, share, children and peer
        links are dropped; the parent link closes (``keep_connected`` dials anew)."""
        if to is None:
            self.whereabouts.go_home()
        else:
            self.whereabouts.go(*to)
        self._drop_children()
        self._take_place(None, JoinState.JOINING)
        if self.neighbours.parent is not None:
            self.neighbours.parent.close()
        self._changed()

    def welcomed(self, msg: Welcome) -> None:
        """The parent's WELCOME: this node's place (``welcome.welcomed_place``: its
        ``ProtocolError`` and ``JoinRefused``), or what the tree runs there from now on."""
        try:
            place = welcomed_place(msg, self.place, self.listen_address is not None,
                                   self.local_processes)
        except ProtocolError:
            if self.whereabouts.away and self.place is not None:   # the tree that moved it is gone
                log.warning("%s: its parent offers another tree than the one it moved to; it "
                            "joins its configured parent again", self.label)
                self.rejoin()
            raise
        tree = place.tree
        replanned = self.place is not None and place != self.place
        self.place = place
        if self.state is JoinState.JOINING:
            self.state = JoinState.WELCOMED
        self._size_slots()
        if replanned:   # the master re-planned (--plan auto): its ASSIGN follows; pass both on
            log.info("the tree runs %s, stragglers %s from now on", place.scheme,
                     ",".join(map(str, tree.stragglers)))
            self.engine.stats.measured.clear()
            self._welcome_children()
        if msg.job and msg.job != self.job:
            self.run_job(msg.job)          # the tree moved to another job while it was away
        vector = None if msg.total is None or msg.dtype is None else (msg.total, msg.dtype)
        self.engine.learn(msg.tree_step, vector)
        log.info("joined as %s (layer %d of %d); the tree is at step %d", place.name, place.layer,
                 tree.layers, self.engine.tree_step)
        self._changed()

    def assigned(self, msg: Assign, payload: memoryview) -> None:
        """The parent's ASSIGN: this subtree's shares (and the ring place, rar)."""
        assert self.place is not None
        allocation = parse_allocation(payload, msg.samples)
        if self.place.name not in allocation:
            raise ProtocolError(f"ASSIGN: the allocation has no share for {self.place.label}")
        self.allocation, self.samples = allocation, msg.samples
        share = allocation[self.place.name]
        log.info("assignment: %d local samples of %d", sum(b - a for a, b, _ in share.local),
                 msg.samples)
        if msg.ring is not None and self.place.ring is None:
            self.place = dataclasses.replace(self.place, ring=msg.ring)
            self.mesh.keep_successor(msg.ring)
        if self.place.scheme == "spread" and msg.peers:
            peers = msg.peers
            if self.place.layer == 1 and peers[0] is None:
                peers = (self.parent_address, *peers[1:])   # the master, where this node dials it
            self.mesh.join(self.place.tree, self.place.name, peers, msg.hosts)
        self._assigned()

