"""`crnet run` end to end: real daemons, real training processes, real signals."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.tools.run import Run, _signal_group

from ..helpers import REPO
from ..helpers.loop import single_process
from ..helpers.vectors import gradients

pytestmark = pytest.mark.timeout(120)

SMALL = ["--fanout", "2", "--layers", "1", "--stragglers", "1"]          # 3 hosts
MEDIUM = ["--fanout", "2", "--layers", "2", "--stragglers", "1"]         # 7 hosts

# One training script for every test; argv: mode, the directory its pids go to.
SCRIPT = r'''
import json, os, signal, subprocess, sys, time
import numpy as np
from crnet import Client

mode, piddir = sys.argv[1], sys.argv[2]
rank = int(os.environ["CRNET_RANK"])


def record(name, pid):
    with open(f"{piddir}/{name}.tmp", "w") as f:
        f.write(str(pid))
    os.rename(f"{piddir}/{name}.tmp", f"{piddir}/{name}")


record(f"rank{rank}", os.getpid())
if mode == "wait" and rank == 0:
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # only SIGKILL stops this one
with Client(timeout=60) as c:
    a = c.assignment
    if mode == "sum":
        c.barrier("start")                            # all $CRNET_WORLD_SIZE processes: step 0
        # Integer-valued gradients: every partial sum is exact, so the result must be too.
        grads = np.random.default_rng(7).integers(-1000, 1000, (a.samples, 16)).astype(np.float64)
        for step in range(3):
            local = np.zeros(16)
            for start, stop, weight in a.ranges:
                local += weight * grads[start:stop].sum(axis=0)
            got = c.allreduce((step + 1) * local, step=step)
            assert np.array_equal(got, (step + 1) * grads.sum(axis=0)), (step, got)
        for i in range(4):                            # one line in several writes
            sys.stdout.write(f"piece{i} ")
            sys.stdout.flush()
            time.sleep(0.01)
        print(f"rank={rank}")
        env = {k: v for k, v in os.environ.items() if k.startswith("CRNET_")}
        print("OK " + json.dumps(dict(env, assignment=a.name, samples=a.samples)))
        print(f"to stderr {rank}", file=sys.stderr)
        sys.stdout.write("no newline at the end")
        sys.exit(0)
    if mode == "fail" and rank == 1:
        with open(os.path.join(os.path.dirname(piddir), "lives1"), "a") as f:   # each life's seat
            f.write(json.dumps({k: v for k, v in os.environ.items()
                                if k.startswith("CRNET_") or k.endswith("RANK")}) + "\n")
        sys.exit(3)
    if rank == 2:                                     # a helper in its process group
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        record("helper", helper.pid)
    print("ready", flush=True)
    time.sleep(600)
'''


# The README's training loop (taken from README.md, as tests/tree/test_loop.py runs it) in a
# real process; argv: mode, the directory its pids go to. Mode "die": rank 1 SIGKILLs itself
# at step DIE_AT of its first life (a marker file, made first, says that life was lost);
# "steady": no one dies (a test kills a daemon). Each process writes its final parameters to
# w<rank>.npy and each life's seat to lives<rank>; going<rank> appears once it reached GOING.
LOOP_STEPS, LOOP_SAMPLES, LOOP_DIM, LOOP_LR, LOOP_SEED = 200, 24, 8, 0.5, 11
LOOP_SCRIPT = r'''
import json, os, signal, sys, time
import numpy as np
from crnet import Client
from tests.helpers.loop import readme_train
from tests.helpers.vectors import gradients

STEPS, DIM, LR, SEED = @PARAMETERS@
STEP_S, DIE_AT, GOING = 0.03, 10, 5
mode, piddir = sys.argv[1], sys.argv[2]
out = os.path.dirname(piddir)
rank = int(os.environ["CRNET_RANK"])
with open(f"{piddir}/rank{rank}.tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(f"{piddir}/rank{rank}.tmp", f"{piddir}/rank{rank}")
with open(f"{out}/lives{rank}", "a") as f:
    f.write(json.dumps({k: v for k, v in os.environ.items()
                        if k.startswith("CRNET_") or k.endswith("RANK")}) + "\n")


def micro_batches(a, step):
    if step == GOING:
        open(f"{out}/going{rank}", "w").close()
    if mode == "die" and rank == 1 and step == DIE_AT and not os.path.exists(f"{out}/died"):
        open(f"{out}/died", "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(STEP_S)              # the emulated compute
    yield a.ranges


def gradient(w, ranges):
    g = np.zeros_like(w)
    for start, stop, weight in ranges:
        g += weight * grads[start:stop].sum(axis=0)
    return g


with Client(timeout=60) as c:
    grads = gradients(SEED, c.assignment.samples, DIM)
    print(f"stale={c.stale}", flush=True)
    w = readme_train()(c, np.zeros(DIM), STEPS, micro_batches, gradient, LR)
np.save(f"{out}/w{rank}.tmp.npy", w)
os.rename(f"{out}/w{rank}.tmp.npy", f"{out}/w{rank}.npy")
'''.replace("@PARAMETERS@", f"{LOOP_STEPS}, {LOOP_DIM}, {LOOP_LR!r}, {LOOP_SEED}")


def alive(pid: int) -> bool:
    """Running (a zombie has exited; only its parent's reaping is left)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def daemons_under(root: Path) -> list[int]:
    """The pids of the crnetd processes whose sockets are under ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"daemon" in argv and any(str(root).encode() in a for a in argv) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def wait_for(check, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return result


def assert_all_gone(pids) -> None:
    wait_for(lambda: not [p for p in pids if alive(p)], f"none of {sorted(pids)} left running", 5.0)


class Launches:
    """Starts ``python -m crnet run``; at teardown stops whatever a failed test left behind."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.pids = tmp_path / "pids"
        self.pids.mkdir()
        (tmp_path / "tmp").mkdir()
        self.script = tmp_path / "train.py"
        self.script.write_text(SCRIPT)
        self.loop_script = tmp_path / "loop.py"
        self.loop_script.write_text(LOOP_SCRIPT)
        self.env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"),
                        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self.procs: list[subprocess.Popen] = []

    def argv(self, *options: str, mode: str, loop: bool = False, strict: bool = True) -> list[str]:
        script = self.loop_script if loop else self.script
        return [sys.executable, "-m", "crnet", "run", *(["--strict"] if strict else []),
                *options, "--", sys.executable, str(script), mode, str(self.pids)]

    def start(self, *options: str, mode: str, loop: bool = False,
              strict: bool = True) -> subprocess.Popen:
        """``loop``: the README's loop (LOOP_SCRIPT), else SCRIPT."""
        proc = subprocess.Popen(self.argv(*options, mode=mode, loop=loop, strict=strict),
                                cwd=REPO, env=self.env,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def run(self, *options: str, mode: str, loop: bool = False,
            timeout: float = 90) -> subprocess.CompletedProcess:
        proc = self.start(*options, mode=mode, loop=loop)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def lives(self, rank: int) -> list[dict]:
        """Each life's seat (its CRNET_* and *RANK variables) of rank ``rank``, in order."""
        path = self.tmp / f"lives{rank}"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def final_parameters(self, ranks) -> dict[int, np.ndarray]:
        return {rank: np.load(self.tmp / f"w{rank}.npy") for rank in ranks}

    def recorded(self) -> dict[str, int]:
        return {p.name: int(p.read_text()) for p in self.pids.iterdir() if not p.name.endswith(".tmp")}

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
        for pid in [*self.recorded().values(), *daemons_under(self.tmp)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def launches(tmp_path):
    it = Launches(tmp_path)
    yield it
    it.cleanup()


def prefixed(text: str) -> list[tuple[str, str]]:
    """Every line as (label, rest); fails on a line without a host prefix."""
    lines = []
    for line in text.splitlines():
        m = re.fullmatch(r"\[([\w./]+)\] (.*)", line)
        assert m, f"a line without a host prefix: {line!r}"
        lines.append((m[1], m[2]))
    return lines


@pytest.mark.parametrize("shape, tree, k", [(MEDIUM, Tree((2, 2), (1, 1)), 1),
                                            (SMALL, Tree((2,), (1,)), 2)], ids=["7hosts", "3hosts-x2"])
def test_every_process_gets_the_exact_sum_and_its_output_is_prefixed(launches, shape, tree, k):
    hosts = list(tree.names())
    extra = ["--local-processes", "2", "--job", "my-job", "--keep-logs"] if k == 2 else []
    done = launches.run(*shape, "--samples", "40", *extra, mode="sum")
    assert done.returncode == 0, done.stdout + done.stderr
    labels = [("master" if h == "" else h) + ("" if k == 1 else f"/{i}") for h in hosts for i in range(k)]

    out = prefixed(done.stdout)
    reports = {label: json.loads(rest[3:]) for label, rest in out if rest.startswith("OK ")}
    assert sorted(reports) == sorted(labels)
    assert {label for label, rest in out if rest == "no newline at the end"} == set(labels)
    pieces = [(label, rest) for label, rest in out if rest.startswith("piece")]
    assert len(pieces) == len(labels)
    for label, rest in pieces:                        # whole lines, never interleaved
        assert re.fullmatch(r"piece0 piece1 piece2 piece3 rank=\d+", rest), rest
        assert rest.endswith(f"rank={reports[label]['CRNET_RANK']}")

    for rank, label in enumerate(labels):             # the master's host first
        env = reports[label]
        host, _, local = label.partition("/")
        host = "" if host == "master" else host
        assert env["CRNET_HOST"] == env["assignment"] == host
        assert env["CRNET_LOCAL_PROCESS"] == (local or "0")
        assert env["CRNET_RANK"] == str(rank)
        assert env["CRNET_WORLD_SIZE"] == str(len(labels))
        assert env["samples"] == 40
        assert env["CRNET_CLIENT_SOCKET"].endswith(f"{label.partition('/')[0]}.sock")
    jobs = {env["CRNET_JOB"] for env in reports.values()}
    assert len(jobs) == 1 and (k == 1 or jobs == {"my-job"})

    err = [line for line in done.stderr.splitlines() if not line.startswith("crnet run: ")]
    assert sorted(prefixed("\n".join(err))) == sorted((label, f"to stderr {reports[label]['CRNET_RANK']}")
                                                       for label in labels)
    workdirs = list((launches.tmp / "tmp").iterdir())
    if k == 1:      # a temporary workdir goes away after a run that succeeded
        assert workdirs == []
    else:           # unless --keep-logs
        assert [p.name for p in workdirs[0].iterdir()] == ["logs"]
        assert (workdirs[0] / "logs" / "master.log").is_file()
        assert f"daemon logs in {workdirs[0] / 'logs'}" in done.stderr
    assert daemons_under(launches.tmp) == []


def test_a_failing_process_stops_the_run_with_its_exit_code(launches):
    proc = launches.start(*SMALL, "--samples", "12", mode="fail")
    # rank 0 (master) and rank 2 (host 1) and its helper wait; rank 1 (host 0) exits 3.
    pids = wait_for(lambda: (r := launches.recorded()).keys() >= {"rank0", "rank1", "rank2", "helper"}
                    and r, "every process to start")
    daemons = daemons_under(launches.tmp)
    assert len(daemons) == 3
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, out + err
    assert "crnet run: [0] failed first (exit code 3)" in err
    assert "Traceback" not in err
    logs = re.search(r"daemon logs in (\S+)", err.splitlines()[-1])
    assert logs and Path(logs[1], "master.log").is_file()    # kept: the run failed
    assert_all_gone([*pids.values(), *daemons])
    assert daemons_under(launches.tmp) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_everything(launches, sig):
    workdir = launches.tmp / "w"
    proc = launches.start(*SMALL, "--samples", "12", "--workdir", str(workdir), mode="wait")
    pids = wait_for(lambda: (r := launches.recorded()).keys() >= {"rank0", "rank1", "rank2", "helper"}
                    and r, "every process to start")
    daemons = daemons_under(workdir)
    assert len(daemons) == 3
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    # rank 0 ignores SIGINT: SIGKILLed after the grace; the others die of the signal first.
    assert proc.returncode == 128 + sig, out + err
    assert f"crnet run: {sig.name}: forwarded to the training processes" in err
    assert "\nTraceback" not in "\n" + err          # KeyboardInterrupt in [0], [1]: theirs
    assert_all_gone([*pids.values(), *daemons])
    assert (workdir / "logs" / "master.log").is_file()          # --workdir stays


def test_a_signal_while_the_tree_starts_stops_it(launches):
    workdir = launches.tmp / "w"
    proc = launches.start(*MEDIUM, "--samples", "12", "--workdir", str(workdir), mode="wait")
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("crnet run: 7 training processes")  # starting now
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, out + err
    assert "crnet run: SIGINT while starting the tree: stopped" in err
    assert "\nTraceback" not in "\n" + err
    assert daemons_under(workdir) == []


def test_an_exception_in_the_launcher_stops_everything(tmp_path, monkeypatch):
    launches = Launches(tmp_path)
    monkeypatch.setenv("PYTHONPATH", launches.env["PYTHONPATH"])

    daemons = []

    def supervise_then_fail(self):
        wait_for(lambda: launches.recorded().keys() >= {"rank0", "rank1", "rank2", "helper"},
                 "every process to start")
        daemons.extend(daemons_under(tmp_path))
        raise RuntimeError("a bug in the launcher")

    monkeypatch.setattr(Run, "_supervise", supervise_then_fail)
    out, err = io.BytesIO(), io.BytesIO()
    run = Run(Tree((2,), (1,)), [sys.executable, str(launches.script), "wait", str(launches.pids)],
              samples=12, workdir=tmp_path / "w", strict=True, stdout=out, stderr=err)
    try:
        with pytest.raises(RuntimeError, match="a bug in the launcher"):
            run.run()
        assert len(daemons) == 3
        assert_all_gone([*launches.recorded().values(), *daemons])
        assert b"daemon logs in" in err.getvalue()
    finally:
        launches.cleanup()


@pytest.mark.parametrize("args, message", [
    (SMALL, "Missing argument 'COMMAND...'"),
    ([*SMALL, "--"], "Missing argument 'COMMAND...'"),
    (["--bogus", "--", "true"], "No such option"),
    (["--fanout", "2", "--stragglers", "2", "--", "true"], "stragglers must be in 0..1"),
    (["--local-processes", "0", "--", "true"], "0 is not in the range"),
    (["--max-restarts", "-1", "--", "true"], "-1 is not in the range x>=0"),
])
def test_usage_errors(args, message):
    proc = subprocess.run([sys.executable, "-m", "crnet", "run", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "Usage: " in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_command_that_does_not_exist_is_an_error_not_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "crnet", "run", *SMALL, "--", "no-such-command-x"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "no-such-command-x: command not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_with_strict_a_daemon_that_dies_fails_the_run_naming_it_and_its_log(launches):
    """--strict (every test here runs so): a daemon that exits while the processes run (here
    SIGKILLed, as one whose handler raised exits 70) fails the run like a training process
    that does, and the end names the daemon and its log, though its tree routes around it."""
    workdir = launches.tmp / "w"
    proc = launches.start(*SMALL, "--samples", "12", "--workdir", str(workdir), mode="wait")
    wait_for(lambda: launches.recorded().keys() >= {"rank0", "rank1", "rank2", "helper"},
             "every process to start")
    log = workdir / "logs" / "0.log"
    leaf = next(pid for pid in daemons_under(workdir)
                if b"0.sock" in Path(f"/proc/{pid}/cmdline").read_bytes())
    os.kill(leaf, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, out + err
    assert f"crnet run: crnetd 0 exited with code -9; its log: {log}" in err, err
    assert "crnet run: a daemon failed (--strict)" in err, err
    assert f"crnet run: crnetd 0 exited with -9 (its log: {log})" in err, err
    assert daemons_under(workdir) == []


def test_a_daemon_gone_for_good_ends_the_run_at_once(launches):
    """Without --strict, as users run it: a daemon that exits with no restart left fails
    the run within the failure grace, not after its processes spent a minute trying to
    reconnect."""
    workdir = launches.tmp / "w"
    proc = launches.start(*SMALL, "--samples", "12", "--workdir", str(workdir), mode="wait",
                          strict=False)
    wait_for(lambda: launches.recorded().keys() >= {"rank0", "rank1", "rank2", "helper"},
             "every process to start")
    leaf = next(pid for pid in daemons_under(workdir)
                if b"0.sock" in Path(f"/proc/{pid}/cmdline").read_bytes())
    killed = time.monotonic()
    os.kill(leaf, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - killed
    assert proc.returncode != 0, out + err
    assert "crnet run: a daemon failed with no restart left; the training processes get 5 s" \
        in err, err
    assert took < 5 + 5 + 10, (took, err)      # the grace, SIGTERM's grace, slack for load
    assert daemons_under(workdir) == []


def test_a_reaped_process_whose_pid_another_group_now_has_is_not_signalled():
    """(issue 54 row 7) The end of a run kills the group of every process a seat ever had:
    one reaped long ago may have left its pid to an unrelated process, here a session
    leader of its own; that one is left alone, and a group still ours is killed."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        # A seat's earlier life, reaped, whose number `other` now has.
        _signal_group(SimpleNamespace(pid=other.pid, returncode=0), signal.SIGKILL)
        time.sleep(0.3)
        assert other.poll() is None
        _signal_group(other, signal.SIGKILL)                  # running: its group, as before
        assert other.wait(5) == -signal.SIGKILL
    finally:
        other.kill()
        other.wait()


# ---- --max-restarts ---------------------------------------------------------------------

def assert_single_process_training(launches, ranks) -> None:
    """Every process ended with the parameters of single-process gradient descent."""
    want = single_process(gradients(LOOP_SEED, LOOP_SAMPLES, LOOP_DIM), LOOP_STEPS, LOOP_LR)
    for rank, w in launches.final_parameters(ranks).items():
        np.testing.assert_allclose(w, want, rtol=1e-9, atol=1e-12, err_msg=f"rank {rank}")


def test_a_killed_process_is_restarted_in_its_seat_and_trains_on(launches):
    """--max-restarts 1: rank 1 SIGKILLs itself at step 10 of the README's loop; it is
    started again in the same seat, joins the running job stale, takes the others'
    state, and every process ends with single-process training's parameters."""
    done = launches.run(*SMALL, "--samples", str(LOOP_SAMPLES), "--timeout", "5",
                        "--max-restarts", "1", mode="die", loop=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "crnet run: [0] exited with code 137: restart 1 of 1 in 0.5 s" in done.stderr, done.stderr
    assert done.stderr.count(": restart ") == 1
    assert "failed first" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    lives = launches.lives(1)
    assert len(lives) == 2 and lives[0] == lives[1], lives     # the same seat, the same job
    assert lives[0]["CRNET_HOST"] == "0" and lives[0]["CRNET_RANK"] == "1"
    assert [len(launches.lives(r)) for r in (0, 2)] == [1, 1]
    assert [rest for label, rest in prefixed(done.stdout) if label == "0"] == ["stale=False", "stale=True"]
    assert_single_process_training(launches, range(3))
    assert daemons_under(launches.tmp) == []


def test_without_restarts_a_killed_process_ends_the_run_as_before(launches):
    """--max-restarts 0 (the default, given here): the same death ends the run with 137."""
    proc = launches.start(*SMALL, "--samples", str(LOOP_SAMPLES), "--timeout", "5",
                          "--max-restarts", "0", mode="die", loop=True)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 137, out + err
    assert "crnet run: [0] failed first (exit code 137); the others still running get 5 s" in err, err
    assert ": restart " not in err and "started again" not in err, err
    assert len(launches.lives(1)) == 1
    assert daemons_under(launches.tmp) == []


def test_a_killed_daemon_is_started_again_and_the_run_goes_on(launches):
    """--max-restarts 3: the leaf daemon 0 is SIGKILLed mid-run and started again with the
    same arguments (one restart); its training process may die with it (DaemonNotRunning)
    and is then restarted too, once the daemon is back (a second); 3 leave room. The run
    exits 0 and every process ends with single-process training's parameters."""
    workdir = launches.tmp / "w"
    proc = launches.start(*SMALL, "--samples", str(LOOP_SAMPLES), "--timeout", "5",
                          "--workdir", str(workdir), "--max-restarts", "3", mode="steady", loop=True)
    wait_for(lambda: (launches.tmp / "going1").exists(), "rank 1 to train", 60)
    leaf = next(pid for pid in daemons_under(workdir)
                if b"0.sock" in Path(f"/proc/{pid}/cmdline").read_bytes())
    os.kill(leaf, signal.SIGKILL)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, out + err
    log = workdir / "logs" / "0.log"
    assert f"crnet run: crnetd 0 exited with code -9; its log: {log}: restart 1 of 3 in 0.5 s" in err, err
    again = re.search(r"crnet run: crnetd 0 started again \(pid (\d+)\)", err)
    assert again and int(again[1]) != leaf, err
    restarts = [line for line in err.splitlines() if ": restart " in line]
    assert 1 <= len(restarts) <= 2, err          # the daemon, and maybe its process
    assert all(line.startswith("crnet run: [0] exited with code ") for line in restarts[1:]), err
    assert len(launches.lives(1)) == len(restarts)
    assert [len(launches.lives(r)) for r in (0, 2)] == [1, 1]
    assert "failed first" not in err and "a daemon failed" not in err, err
    assert_single_process_training(launches, range(3))
    assert daemons_under(workdir) == []


def test_the_restarts_are_one_budget_and_the_failure_past_it_ends_the_run(launches):
    """--max-restarts 2: rank 1 exits 3 in every life; it is restarted twice (each time in
    its seat), then its third failure ends the run with exit code 3, as without restarts."""
    proc = launches.start(*SMALL, "--samples", "12", "--max-restarts", "2", mode="fail")
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 3, out + err
    announced = [line for line in err.splitlines() if ": restart " in line]
    assert announced == [f"crnet run: [0] exited with code 3: restart {n} of 2 in {pause} s"
                         for n, pause in ((1, "0.5"), (2, "1"))], err   # backing off
    assert ("crnet run: [0] failed first (exit code 3, no restart left of 2); the others still "
            "running get 5 s, then SIGTERM") in err, err
    assert err.index("restart 2 of 2") < err.index("failed first")
    lives = launches.lives(1)
    assert len(lives) == 3 and lives[0] == lives[1] == lives[2], lives
    assert "Traceback" not in err
    assert daemons_under(launches.tmp) == []
