"""The counters a node keeps; a training process reads them with ``Client.stats()``."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Stats:
    steps_done: int = 0
    steps_failed: int = 0
    children_skipped: int = 0          # children a step was decoded without
    times_skipped: int = 0             # steps this node's parent finished without it
    decode_seconds: float = 0.0
    receive_seconds: float = 0.0       # first child byte of a step -> its quorum decoded
    bytes_up: int = 0                  # received from children (or the ring predecessor)
    bytes_down: int = 0                # received from the parent

    def as_dict(self) -> dict:
        return asdict(self)
