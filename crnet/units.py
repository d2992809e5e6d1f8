"""Units on the command line: link rates, durations and sizes (pure parsing, no I/O).

Rates are returned in bytes per second, durations in seconds, sizes in bytes. Bits and bytes
are told apart by spelling: ``100Mbit`` is 100e6 bits/s (case-insensitive, as ``tc`` writes
``100mbit``), ``12.5MB`` is 12.5e6 bytes/s (capital B). ``Mbps`` is refused: ``tc`` reads it as
megabytes, most people as megabits.
"""

from __future__ import annotations

import math
import re

__all__ = ["format_bytes", "format_rate", "format_seconds", "parse_bandwidth", "parse_bytes",
           "parse_per_second", "parse_seconds", "plural"]

_NUMBER = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S*)\s*$")

_BITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}  # lower case
_BYTES = {"B": 1.0, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40}
_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "μs": 1e6, "ns": 1e9}  # 50us = 50 / 1e6


def parse_bandwidth(text: str) -> float:
    """``100Mbit``, ``1Gbit``, ``1gbit/s``, ``12.5MB``, ``12.5MB/s`` -> bytes per second (> 0)."""
    value, unit = _split(text, "bandwidth", "100Mbit, 1Gbit or 12.5MB")
    rate_unit = unit[:-2] if unit.endswith("/s") else unit
    if rate_unit.lower() in _BITS:
        rate = value * _BITS[rate_unit.lower()] / 8.0
    elif rate_unit in _BYTES:
        rate = value * _BYTES[rate_unit]
    elif unit.lower().endswith("bps"):
        number, prefix = str(text).strip()[:-len(unit)], unit[:-3]
        # bits take any case (100mbit, 100Mbit); bytes want a capital M, G, T (mB is milli)
        raise ValueError(f"bandwidth {text!r} is ambiguous: write {number}{prefix}bit for bits "
                         f"per second or {number}{prefix.capitalize()}B for bytes per second")
    elif not unit:
        raise ValueError(f"bandwidth {text!r} needs a unit, e.g. 100Mbit, 1Gbit or 12.5MB")
    else:
        raise ValueError(f"bandwidth {text!r}: unknown unit {unit!r} (use bit, kbit, Mbit, Gbit "
                         "for bits per second, or B, kB, MB, GB, MiB for bytes per second)")
    if not rate > 0:
        raise ValueError(f"bandwidth {text!r} must be > 0")
    return rate


def parse_seconds(text: str) -> float:
    """``50us``, ``0.2ms``, ``1s``, ``0`` -> seconds (>= 0). A unit is required except for 0."""
    value, unit = _split(text, "duration", "50us, 0.2ms or 1s")
    if not unit:
        if value == 0:
            return 0.0
        raise ValueError(f"duration {text!r} needs a unit: s, ms, us or ns (e.g. 50us)")
    if unit not in _PER_SECOND:
        raise ValueError(f"duration {text!r}: unknown unit {unit!r} (use s, ms, us or ns)")
    if value < 0:
        raise ValueError(f"duration {text!r} must be >= 0")
    return value / _PER_SECOND[unit]


def parse_per_second(text: str) -> float:
    """``1e5/s``, ``100/ms``, ``0.1/us`` -> events per second (> 0); a plain number is per second."""
    number, slash, unit = str(text).strip().partition("/")
    value, rest = _split(number, "rate", "1e5/s or 100/ms")
    if rest or (slash and unit.strip() not in _PER_SECOND):
        raise ValueError(f"rate {text!r}: expected a number per s, ms, us or ns (e.g. 100/ms)")
    rate = value * (_PER_SECOND[unit.strip()] if slash else 1.0)
    if not rate > 0:
        raise ValueError(f"rate {text!r} must be > 0")
    return rate


def parse_bytes(text: str) -> float:
    """``20000``, ``20kB``, ``4MB``, ``1MiB`` -> bytes (> 0); a plain number is bytes."""
    value, unit = _split(text, "size", "20000, 20kB or 4MB")
    if unit and unit not in _BYTES:
        raise ValueError(f"size {text!r}: unknown unit {unit!r} (use B, kB, MB, GB, KiB, MiB, GiB)")
    size = value * _BYTES.get(unit, 1.0)
    if not size > 0:
        raise ValueError(f"size {text!r} must be > 0")
    return size


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 layer``, ``2 layers``, ``0 children`` (``words``: an irregular plural)."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def format_seconds(seconds: float) -> str:
    """4 significant digits in s, ms or µs: ``23.41 ms``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return "0 s" if seconds == 0 else f"{seconds / 1e-9:.4g} ns"


def format_bytes(size: float) -> str:
    """``20 kB``, ``4 MB``, ``1.049 MB`` (decimal prefixes, 4 significant digits)."""
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size:.4g} B"


def format_rate(bytes_per_s: float) -> str:
    """``1 Gbit/s`` style, from bytes per second."""
    bits = 8.0 * bytes_per_s
    for scale, unit in ((1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bits >= scale:
            return f"{bits / scale:.4g} {unit}"
    return f"{bits:.4g} bit/s"


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    match = _NUMBER.match(str(text))
    if not match:
        raise ValueError(f"{what} {text!r} is not a number with a unit, e.g. {example}")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise ValueError(f"{what} {text!r} must be finite")
    return value, match.group(2)
