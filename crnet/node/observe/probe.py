"""``crnet tune --probe``, the daemon's side: time this node's links to its children and a
fixed compute kernel, for a tree that has not trained yet.

Asked with the status request (``StatusRequest.probe``: the bytes per round), answered in
the node's ``measured`` status section (``probe``), so it travels, is bounded and is
checked as every status answer is (``crnet.protocol.status_measured``). Each node, before it asks
its children (``status.py``):

- **links**: to each child in turn, ``PROBE_ROUNDS`` rounds of the asked bytes (PROBE
  frames of at most ``PROBE_FRAME`` bytes, which the child reads into one buffer and
  forgets: ``ProbeSink``), each timed
  from its first byte queued to the child's PROBE_ECHO of its last frame. The kernel's
  account of the link (``TCP_INFO``: the delivery rate of those full flights, the
  round-trip times) is read afterwards, as for every status answer (``measure.py``);
- **compute**: ``PROBE_ROUNDS`` runs of ``kernel_seconds``' kernel, ``KERNEL_REPEAT``
  products of two 64 x 64 float32 matrices (a few ms), in a worker thread. Small enough
  that OpenBLAS runs each on one thread (larger ones use every core, and on a host whose
  cores are busy its threads wait for each other: times 100 x apart were seen).

Who may start one (the threat model of docs/operations.md: a host that holds the secret
must not make others exhaust memory or stop): only the master, for an authenticated
status client (``claim``), only while no process of any job is attached anywhere (the
master's counts, ``node/collectives/jobs.py``), one at a time, and at most ``PROBE_DUTY`` of
the time (the next waits 9 x as long as the last took); a node below runs the one its
parent asks for. The bytes are bounded by ``PROBE_BYTES_MAX`` (the request is refused at parsing
otherwise), sent from one zeroed buffer (the same for every child), and every wait has the request's deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from ...defaults import PROBE_DUTY, PROBE_FRAME, PROBE_ROUNDS
from ...errors import ProtocolError
from ...measure.windows import micros
from ...peer_text import shown
from ...protocol.messages import Probe, ProbeEcho
from ...schemes.base import Place
from ..neighbours import Neighbours

__all__ = ["KERNEL", "KERNEL_REPEAT", "ProbeSink", "Prober", "kernel_seconds"]

KERNEL = 64             # the kernel multiplies KERNEL x KERNEL float32 matrices ...
KERNEL_REPEAT = 400     # ... this many times (210 MFLOP)


def kernel_seconds(rounds: int = PROBE_ROUNDS) -> list[float]:
    """Seconds of each of ``rounds`` runs of the kernel (after one product to warm up)."""
    a = np.random.default_rng(0).standard_normal((KERNEL, KERNEL), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, a, out=out)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(KERNEL_REPEAT):
            np.matmul(a, a, out=out)
        times.append(time.perf_counter() - start)
    return times


class ProbeSink:
    """Where a child reads its parent's PROBE bytes (and forgets them): one buffer of
    ``PROBE_FRAME`` bytes, made at the first probe; a larger frame is a ProtocolError."""

    def __init__(self) -> None:
        self._buffer: memoryview | None = None

    def dest(self, nbytes: int) -> memoryview:
        if nbytes > PROBE_FRAME:
            raise ProtocolError(f"PROBE: a frame of {nbytes} bytes (at most {PROBE_FRAME})")
        if self._buffer is None:
            self._buffer = memoryview(bytearray(PROBE_FRAME))
        return self._buffer[:nbytes]


class Prober:
    """This node's probe: who may start one (``claim``), and running it (``run``)."""

    def __init__(self, neighbours: Neighbours, place: Callable[[], Place | None],
                 assigned: Callable[[], bool], attached: Callable[[], tuple[str, int] | None]):
        self.neighbours = neighbours
        self.place = place
        self.assigned = assigned
        self.attached = attached            # a job with processes attached in the tree, if any
        self.busy = False
        self._started: float | None = None   # the running probe's start (a status client's)
        self._next = 0.0                      # when a status client may start the next one
        self._ids = 0
        self._echoes: dict[tuple[int, int, int], asyncio.Future[None]] = {}  # (id, slot, round)

    def claim(self, client: bool) -> str | None:
        """Take the probe for a request (``client``: a status client's, else the parent's):
        None, or why not (a status client is then refused)."""
        if self.busy:
            return "a probe is under way: ask again once it answered"
        if client:
            wait = self._next - time.monotonic()
            if wait > 0:
                return (f"a probe ran just now, and probes take at most {PROBE_DUTY:.0%} of the "
                        f"tree's time: ask again in {wait:.1f} s")
            place = self.place()
            if place is None or not place.is_master:
                return "only the master runs a probe: ask it (crnet tune MASTER --probe)"
            if not self.assigned():
                return "the tree is not complete yet: the probe needs every worker joined"
            running = self.attached()
            if running is not None:
                job, n = running
                return (f"{n} process{'es' if n != 1 else ''} of job "
                        f"{shown(job) if job else '(unnamed)'} attached: the probe runs only on "
                        "an idle tree (stop them, or wait for the job to end)")
        self.busy = True
        self._started = time.monotonic() if client else None
        return None

    def release(self) -> None:
        """The probe answered. A status client's next one waits until this one's share of
        the time since it began is ``PROBE_DUTY``: a request of some 60 bytes makes every
        node send each child up to ``PROBE_ROUNDS`` x ``PROBE_BYTES_MAX``, and back to back
        the master alone sent 17 GiB in 12.8 s (issue 39, row 11)."""
        self.busy = False
        if self._started is not None:
            now = time.monotonic()
            self._next = now + (now - self._started) * (1 / PROBE_DUTY - 1)
            self._started = None

    async def run(self, nbytes: int, within: float) -> dict:
        """Time each child link and the kernel, within ``within`` seconds (what is not done
        by then is left out): this node's ``probe`` section."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        self._ids += 1
        # (bytes(n) is calloc'ed: zeroed pages are mapped only as they are read.)
        payload = memoryview(bytes(nbytes))
        links = []
        for k, slot in enumerate(self.neighbours.slots):
            if slot.link is not None:
                times = await self._time_link(k, slot.link, payload, deadline)
                if times:
                    links.append({"child": k, "micros": times})
        del payload
        try:   # (a second more than what is left: the links may have taken it all)
            kernel = await asyncio.wait_for(loop.run_in_executor(None, kernel_seconds),
                                            max(0.0, deadline - loop.time()) + 1.0)
        except asyncio.TimeoutError:
            kernel = []        # a host that busy: left out, as a silent node is
        return {"bytes": nbytes, "kernel_micros": [max(1, micros(t)) for t in kernel],
                "links": links}

    async def _time_link(self, k: int, link, payload: memoryview, deadline: float) -> list[int]:
        loop = asyncio.get_running_loop()
        times: list[int] = []
        for r in range(PROBE_ROUNDS):
            echo = self._echoes[(self._ids, k, r)] = loop.create_future()
            try:
                start = time.perf_counter()
                for at in range(0, len(payload), PROBE_FRAME):
                    last = at + PROBE_FRAME >= len(payload)
                    if not link.send(Probe(self._ids, r, last), payload[at:at + PROBE_FRAME]):
                        return times
                await asyncio.wait_for(echo, max(0.0, deadline - loop.time()))
                times.append(max(1, micros(time.perf_counter() - start)))
            except asyncio.TimeoutError:
                return times
            finally:
                del self._echoes[(self._ids, k, r)]
        return times

    def echoed(self, k: int, msg: ProbeEcho) -> None:
        """Child ``k`` got every byte of a round (late, or never asked: moot)."""
        echo = self._echoes.get((msg.id, k, msg.round))
        if echo is not None and not echo.done():
            echo.set_result(None)
