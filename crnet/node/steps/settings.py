"""What one node's step core is told (its timeout, window and memory bounds), and every
time the daemon derives from ``--timeout``: one place for them (``EngineSettings``'s
properties; ``lifecycle.Settings.engine`` makes it from the options)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ... import defaults

__all__ = ["EngineSettings", "physical_memory"]


def physical_memory() -> int:
    """This host's memory in bytes: no vector larger than that is anyone's gradient here."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # not POSIX, or not told
        return defaults.MAX_VECTOR_BYTES


@dataclass(frozen=True)
class EngineSettings:
    timeout: float = defaults.TIMEOUT
    keep_results: int = defaults.KEEP_RESULTS
    window: int = defaults.STEP_WINDOW
    send_queue_bytes: int | None = None     # None: max(SEND_QUEUE_BYTES, 4 vectors)
    result_memory: int = defaults.RESULT_MEMORY
    # The largest vector a peer may claim (a CHUNK's total x dtype): a larger one closes
    # its connection before anything is allocated.
    max_vector_bytes: int = field(default_factory=physical_memory)
    # Hosts authenticate (a cluster secret or TLS): one that holds the secret may be
    # compromised, so what a host relays for another is checked (spread's ring of sums).
    # Not with --insecure: anyone may join there, and nothing is guarded.
    guarded: bool = False
    check_relays: bool = True      # ... and this host checks them (not with --trust-relays)

    @property
    def stall_after(self) -> float:
        """A peer from which nothing arrived this long is cut off as frozen
        (``node/peers/liveness.py``): a share of the timeout, so that a step routes round
        it and still makes its deadline."""
        return self.timeout * defaults.STALL_SHARE

    @property
    def broadcast_window(self) -> float:
        """Seconds after a state request's first complete answer when the master takes the
        state every copy so far shows (``state_answers.py``): the step timeout, within which
        an up-to-date process reaches a step boundary, or is a straggler anyway."""
        return self.timeout

    @property
    def grace(self) -> float:
        """How much longer than ``timeout`` a node waits for the master's decision."""
        return min(defaults.GRACE_MAX, max(defaults.GRACE_MIN, self.timeout * defaults.GRACE_SHARE))

    @property
    def answer_within(self) -> float:
        """Every request of a training process is answered within this many seconds."""
        return self.timeout + self.grace

    @property
    def behind(self) -> int:
        """Steps this many or more behind ``tree_step`` count as decided."""
        return max(self.keep_results, self.window)
