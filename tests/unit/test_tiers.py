"""The two tiers stay what tests/tiers.py says: every test file is in one of its folders, every
file and test it names exists, and the quick tier holds the kinds the README promises."""

from __future__ import annotations

import subprocess
import sys

from ..tiers import BOTH_LOOPS_FILES, FOLDERS, FULL, QUICK_FILES, QUICK_TESTS, TESTS


def test_every_test_file_is_in_one_tier():
    files = {p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py")}
    assert all(f.count("/") == 1 for f in files), "a test file is in a folder of tests/, one deep"
    assert {f.split("/")[0] for f in files} <= set(FOLDERS), "name the folder in tests/tiers.py"
    assert all((TESTS / folder / "__init__.py").exists() for folder in FOLDERS), "a folder is gone"
    named = QUICK_FILES | set(QUICK_TESTS) | BOTH_LOOPS_FILES
    assert named <= files, "tests/tiers.py names files that are gone"
    assert all(FOLDERS[f.split("/")[0]] == FULL for f in QUICK_FILES | set(QUICK_TESTS)), \
        "a quick folder is quick whole: name files and tests only in full folders"


def test_the_quick_tier_holds_every_test_it_names_and_a_real_tree():
    got = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "quick",
         "-p", "no:cacheprovider", *(f"tests/{f}" for f in sorted(set(QUICK_TESTS) | QUICK_FILES))],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stdout + got.stderr
    ids = {line.strip() for line in got.stdout.splitlines() if "::" in line}
    for file, names in QUICK_TESTS.items():
        for name in names:
            assert f"tests/{file}::{name}" in ids, f"tests/{file}::{name} (tests/tiers.py) is not collected"
    assert any(i.startswith("tests/tree/test_loop.py::") for i in ids), "the README's loop is quick"
