"""The kinds of values crnet's options take, as click parameter types.

Shared by the command line (``crnet.cli``), the daemon's option table (``crnet.config.options``),
its config file (``crnet.config.effective``: a file's value is converted as a flag's) and the
benchmarks. Each type also accepts a value it produced itself (a default given already
parsed, a value handed on by a launcher).
"""

from __future__ import annotations

import click

from .. import defaults
from ..units import parse_bytes


class IntList(click.ParamType):
    """An integer or a comma list of integers (one per tree layer): ``4`` or ``4,3``."""

    name = "INT[,INT...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            values = [int(v) for v in str(value).split(",")]
        except ValueError:
            self.fail(f"{value!r} is not an integer or a comma list of integers", param, ctx)
        return values


class UnitValue(click.ParamType):
    """A number with a unit, read by one of ``crnet.units``' parsers (50us, 1Gbit, 4MB)."""

    def __init__(self, name: str, parse):
        self.name, self._parse = name, parse

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return self._parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Size(UnitValue):
    """A size in bytes as a whole number: 1GiB, 64MB, 1048576."""

    def __init__(self):
        super().__init__("SIZE", parse_bytes)

    def convert(self, value, param, ctx):
        return int(super().convert(value, param, ctx))


class ChunkSize(click.ParamType):
    """``auto`` (a chunk size that grows with the vector) or a size in bytes (4MiB, 1048576)."""

    name = "auto|SIZE"

    def convert(self, value, param, ctx):
        if value == defaults.CHUNK_AUTO or (isinstance(value, str) and value.strip().lower() == "auto"):
            return defaults.CHUNK_AUTO
        try:
            size = int(value) if isinstance(value, int) else int(parse_bytes(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if size < 1024:
            self.fail(f"{value!r} is below 1 KiB (or say auto)", param, ctx)
        return size


class ComputeSpec(click.ParamType):
    """A ``crnet.tune.workload.ComputeModel`` spelling: straggle:1e-4,0.1,10 and the like."""

    name = "KIND:ARGS"

    def convert(self, value, param, ctx):
        from ..tune.workload import ComputeModel

        if isinstance(value, ComputeModel):
            return value
        try:
            return ComputeModel.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Address(click.ParamType):
    """HOST:PORT (IPv6 as [::1]:PORT); ports from ``min_port`` (0: any free port)."""

    name = "HOST:PORT"

    def __init__(self, min_port: int = 0):
        self.min_port = min_port

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        if not sep or not port.isdigit():
            self.fail(f"{value!r} is not HOST:PORT", param, ctx)
        if not self.min_port <= int(port) <= 65535:
            self.fail(f"port {port} is out of range {self.min_port}..65535", param, ctx)
        return (host.strip("[]") or "0.0.0.0", int(port))


class MetricsAddress(Address):
    """PORT or HOST:PORT: on 127.0.0.1 unless a host is given."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.isdigit():
            value = f"127.0.0.1:{value}"
        elif isinstance(value, str) and value.startswith(":"):
            value = "127.0.0.1" + value
        return super().convert(value, param, ctx)


def address_text(address: tuple[str, int]) -> str:
    """``(host, port)`` as HOST:PORT ([HOST]:PORT for an IPv6 host), as ``Address`` reads it."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
