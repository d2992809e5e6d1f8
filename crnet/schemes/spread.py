"""spread: CodedReduce with each chunk decoded at its owner (``owners.py``). Being built."""

from __future__ import annotations

from .base import Place, Ports, Scheme


class Spread(Scheme):
    def __init__(self, place: Place, ports: Ports):
        raise NotImplementedError("--scheme spread is being built")
