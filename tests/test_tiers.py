"""The two tiers stay what tests/tiers.py says: every test file is classified, every test
the quick tier names exists, and the quick tier holds the kinds the README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .tiers import BOTH_LOOPS_FILES, FULL_FILES, QUICK_FILES, QUICK_TESTS

TESTS = Path(__file__).resolve().parent


def test_every_test_file_is_in_one_tier():
    files = {p.name for p in TESTS.glob("test_*.py")}
    quick_only = QUICK_FILES | (set(QUICK_TESTS) - FULL_FILES)
    assert not files - quick_only - FULL_FILES, "classify these in tests/tiers.py"
    assert not (quick_only | FULL_FILES) - files, "tests/tiers.py names files that are gone"
    assert not QUICK_FILES & FULL_FILES
    assert set(QUICK_TESTS) <= FULL_FILES, "a file split between the tiers is listed in FULL_FILES"
    assert files >= BOTH_LOOPS_FILES


def test_the_quick_tier_holds_every_test_it_names_and_a_real_tree():
    got = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "quick",
         "-p", "no:cacheprovider", *(f"tests/{f}" for f in sorted(QUICK_TESTS)), "tests/test_loop.py"],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stdout + got.stderr
    ids = {line.strip() for line in got.stdout.splitlines() if "::" in line}
    for file, names in QUICK_TESTS.items():
        for name in names:
            assert f"tests/{file}::{name}" in ids, f"tests/{file}::{name} (tests/tiers.py) is not collected"
    assert any(i.startswith("tests/test_loop.py::") for i in ids), "the README's loop is quick"
