"""What a daemon measures while the tree trains, for ``crnet tune``: the last K steps.

Kept once per step (never per frame), each in a window of the last ``window`` steps
(``crnetd --tune-window``):

- each local training process's **compute time**: from the moment it was last answered
  (its previous step's result delivered, or a broadcast it waited for) to its next SUBMIT.
  A process's first step after it attached has none;
- per child slot, when its first chunk of a step **arrived**, counted from the step's
  start here: the moment this node decided the step before (its result went down to the
  children then, so the interval is their compute plus what their subtrees and links
  add). Steps that overlap (a child's chunk of step t before t - 1 was decided here) are
  not counted;
- the **period** between this node's decisions of consecutive steps (at the master: the
  tree's step time, as a training loop sees it).

Every time is ``time.perf_counter`` (the clock ``UpStep.arrived_at`` uses). Links are
read from the kernel when someone asks (``crnet.protocol.tcp_info``), not here. ``snapshot`` is
the window part of a node's ``measured`` status section (``crnet.protocol.status_measured``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping

from ..defaults import TUNE_WINDOW

MAX_PROCESSES_SHOWN = 8     # processes of one host whose windows a status answer carries

__all__ = ["MAX_PROCESSES_SHOWN", "Measured", "micros"]

Window = collections.deque   # of (step, seconds)


class Measured:
    """One node's windows. Each hook is O(1) per step, process or child."""

    def __init__(self, window: int = TUNE_WINDOW):
        if window < 1:
            raise ValueError(f"the tune window must be >= 1 step, got {window}")
        self.window = window
        self.compute: dict[int, Window] = {}     # seat -> (step, seconds computing)
        self.arrivals: dict[int, Window] = {}    # child slot -> (step, seconds after start)
        self.periods: Window = collections.deque(maxlen=window)   # (step, seconds)
        self._answered: dict[int, float] = {}    # seat -> when it was last answered
        # The two newest decisions here, and when: a step's pieces may be counted just
        # before or just after it is decided (the scheme's order), from the one before.
        self._decided: tuple[int, float] | None = None
        self._before: tuple[int, float] | None = None

    def clear(self) -> None:
        """Forget every window: the tree was re-planned (``--plan auto``), and times of
        the old plan would mix with the new one's."""
        self.compute.clear()
        self.arrivals.clear()
        self.periods.clear()
        self._decided = self._before = None

    # -- the hooks
    def attached(self, seat: int | None) -> None:
        """A process took ``seat``: its first SUBMIT follows no answer of its own."""
        if seat is not None:
            self._answered.pop(seat, None)

    def answered(self, seat: int | None) -> None:
        """The process in ``seat`` got what it waited for (a result, a broadcast)."""
        if seat is not None:
            self._answered[seat] = time.perf_counter()

    def submitted(self, seat: int | None, step: int) -> None:
        """The process in ``seat`` submits its vector of ``step``: it computed since its answer."""
        since = None if seat is None else self._answered.pop(seat, None)
        if seat is None or since is None:
            return
        self._window(self.compute, seat).append((step, time.perf_counter() - since))

    def arrived(self, step: int, at: Mapping[int, float]) -> None:
        """Children's first chunks of ``step`` came at ``at`` (slot -> perf_counter time);
        called once per step, as it is decided here (just before or just after)."""
        last = next((d for d in (self._decided, self._before)
                     if d is not None and d[0] == step - 1), None)
        if last is None:
            return
        for k, when in at.items():
            if when >= last[1]:
                self._window(self.arrivals, k).append((step, when - last[1]))

    def decided(self, step: int) -> None:
        """``step`` resolved here."""
        now = time.perf_counter()
        last = self._decided
        if last is not None and last[0] == step - 1:
            self.periods.append((step, now - last[1]))
        if last is None or step > last[0]:
            self._before, self._decided = last, (step, now)

    def _window(self, table: dict[int, Window], key: int) -> Window:
        found = table.get(key)
        if found is None:
            found = table[key] = collections.deque(maxlen=self.window)
        return found

    # -- the answer
    def snapshot(self, limit: int) -> dict:
        """The windows, each cut to its newest ``limit`` steps, times in microseconds
        (``micros``: integers pack smaller than floats)."""
        def cut(window: Window) -> dict:
            newest = list(window)[-limit:] if limit > 0 else []
            return {"steps": [s for s, _ in newest], "micros": [micros(x) for _, x in newest]}

        seats = sorted(self.compute)[:MAX_PROCESSES_SHOWN]
        return {"window": self.window,
                "compute": [{"process": k, **cut(self.compute[k])} for k in seats],
                "arrivals": [{"child": k, **cut(w)} for k, w in sorted(self.arrivals.items())],
                "periods": cut(self.periods)}


def micros(seconds: float) -> int:
    return max(0, round(seconds * 1e6))
