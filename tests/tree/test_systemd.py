"""scripts/systemd/: the unit verifies, stays hardened, and its environment file is crnetd's."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from crnet.cli import crnetd
from crnet.client import Client
from crnet.coding.plan import Tree
from crnet.tools.launch import LocalTree

from ..helpers import REPO

UNIT = REPO / "scripts" / "systemd" / "crnetd.service"
ENV_FILE = UNIT.with_name("crnetd.env")
INSTALLED = "/opt/crnet/venv/bin/crnetd"     # where docs/operations.md installs it
# `systemd-analyze security --offline=true` of the unit, measured with systemd 252: 1.2
# (8.7 before the hardening). A change that loosens the unit fails here.
MAX_EXPOSURE = 1.2

analyze = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(analyze is None, reason="systemd-analyze is not installed "
                                   "(.ci/run installs the systemd package)")


@needs_analyze
def test_the_unit_verifies(tmp_path):
    """``systemd-analyze verify`` checks that ExecStart exists: a copy of the unit runs the
    crnetd installed here instead of the documented venv's."""
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED}\n" in text
    here = shutil.which("crnetd") or sys.executable
    unit = tmp_path / "crnetd.service"
    unit.write_text(text.replace(INSTALLED, here))
    got = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0 and "crnetd.service" not in got.stderr, got.stderr


@needs_analyze
def test_the_unit_is_hardened():
    got = subprocess.run([analyze, "security", "--offline=true", str(UNIT)],
                         capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for crnetd\.service: (\d+\.\d)", got.stdout)
    assert found, got.stdout + got.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE, got.stdout


def test_the_unit_waits_for_readiness():
    options = dict(line.split("=", 1) for line in UNIT.read_text().splitlines()
                   if "=" in line and not line.startswith("#"))
    assert options["Type"] == "notify" and options["NotifyAccess"] == "main"
    assert options["TimeoutStartSec"] == "infinity"   # READY waits for every host to join
    assert options["EnvironmentFile"] == "-/etc/crnet/crnetd.env"


def test_every_variable_of_the_environment_file_is_a_crnetd_option():
    names = {p.name for p in crnetd.params}
    keys = re.findall(r"^#?\s*CRNET_([A-Z_]+)=", ENV_FILE.read_text(), re.MULTILINE)
    assert keys and all(k.lower() in names for k in keys), sorted(set(keys) - {
        n.upper() for n in names})


PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def _deny_write_execute() -> None:
    """The kernel's MemoryDenyWriteExecute (Linux 6.3+): no mapping both W and X, ever."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_MDWE)")


def test_daemons_run_steps_with_memory_deny_write_execute(tmp_path):
    """The unit's MemoryDenyWriteExecute=yes: crnetd (Python, NumPy, the Cython core,
    uvloop) must never need memory both writable and executable. Set here with the
    kernel's own switch, which execve keeps, on real daemons that run steps."""
    probe = subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_deny_write_execute,
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+)")

    def spawn(name, argv, kwargs):
        return subprocess.Popen(argv, preexec_fn=_deny_write_execute, **kwargs)

    lt = LocalTree(Tree((2,), (1,)), 600, workdir=tmp_path, spawn=spawn, strict=True)
    try:
        lt.start()
        with Client(lt.socket_path("0"), timeout=30) as c:
            for step in range(3):
                got = c.allreduce(np.ones(16, dtype=np.float32), step=step)
                assert got.shape == (16,) and np.all(np.isfinite(got))
        assert all(lt.alive(name) for name in lt.procs)
    finally:
        codes = lt.stop()
        problems = lt.problems()
    assert not problems and set(codes.values()) == {0}, (codes, problems)
