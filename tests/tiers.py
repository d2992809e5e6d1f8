"""How the suite is split: which tests form the quick tier, and which run on both event loops.

The tiers follow the folders. The quick tier (``python -m pytest -q -m quick``, the README's
first test command) answers "does my install work" in a few minutes on 2 cores: ``unit/`` and
``node/`` whole (the pure layers, and a node's rooms in-process), one real tree end to end and
the README's loop. Everything else is the full tier only (``python -m pytest -q``, what CI
runs). ``tests/conftest.py`` marks the quick tests ``quick``; ``tests/unit/test_tiers.py``
fails when a test file is outside the folders named here, or when a file or test named below
is gone, so the lists cannot drift from the files. Files are named by their path below tests/.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Each folder's tier. tests/README.md says what each folder holds.
QUICK, FULL = "quick", "full"
FOLDERS = {
    "unit": QUICK,     # the pure layers: coding, protocol, config, measure, tune's math, schemes, client
    "node": QUICK,     # one node's rooms in-process, over fake links (tests/helpers/fake_links.py)
    "tree": FULL,      # real crnetd processes on 127.0.0.1: end to end, faults, the CLI, crnet tune
    "trust": FULL,     # attacks and authentication: issues 11 and 26, auth, TLS, handshake, fuzz
    "torch": FULL,     # crnet.torch and DDP on real daemons (and on emulated hosts)
    "bench": FULL,     # the benchmarks' own tests (python -m benchmarks, netns, soak, Gloo, digits)
}

# Quick tier, whole files of a full folder: the README's loop, on a real tree.
QUICK_FILES = frozenset({
    "tree/test_loop.py",
})

# Quick tier, single tests of a full folder (pytest's test names, parameters included): one
# real tree of crnetd processes end to end, through the async and the blocking client.
QUICK_TESTS = {
    "tree/test_e2e.py": frozenset({
        "test_every_client_gets_the_exact_sum_despite_stragglers[float64-cr]",
        "test_every_client_gets_the_exact_sum_despite_stragglers[float32-cr]",
        "test_blocking_client_errors",
    }),
}

# Async tests in these files run twice, on asyncio's loop and on uvloop's: they test the
# client side (AsyncClient, the transport it shares with the daemons, the README's loop),
# whose loop is the training process's choice. Any other async test runs once, on uvloop,
# unless it is marked ``both_loops`` (see the conftest's loop-factory hook).
BOTH_LOOPS_FILES = frozenset({
    "tree/test_client_bugs.py",
    "tree/test_client_socket.py",
    "tree/test_loop.py",
    "unit/test_shm.py",
    "unit/test_transport.py",
})


def file_of(path: Path) -> str:
    """A test file's name here: its path below tests/ (``unit/test_codes.py``); the path as
    given for a file outside tests/."""
    try:
        return path.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return path.as_posix()


def is_quick(file: str, name: str) -> bool:
    """Whether test ``name`` (with its parameters) of ``tests/<file>`` is in the quick tier."""
    folder = file.split("/", 1)[0]
    return FOLDERS.get(folder) == QUICK or file in QUICK_FILES or name in QUICK_TESTS.get(file, ())
