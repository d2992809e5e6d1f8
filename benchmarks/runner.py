"""Run every scheme of a preset on one emulated cluster and compare with the model.

Host 0 of the cluster is the master (crnet's coordinator and result observer),
hosts 1..N are the workers: one ``crnetd`` and one emulated training process
(``benchmarks.worker``) each, or one Gloo peer each. Worker i draws the same
compute times in every scheme (``ComputeModel.compute_time(load, seed, step, i)``),
so the schemes see the same stragglers in the same steps; only their loads
differ, as their allocations do.

``cr-approx`` is ``cr`` on the same tree with the master's ``--beyond-s approximate`` (and
the preset's ``--patience``): a parent short of n - s children when its patience runs out
decodes from those there, and the row counts the steps whose result was approximate and
their mean coverage (``Client.last_result_info``, which every worker checks its result
against). The model has no approximate decode: that row has no prediction.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from crnet.coding.plan import Tree, plan, scheme_tree
from crnet.errors import LaunchError
from crnet.schemes.chunks import chunk_bytes_for
from crnet.tools.launch import MASTER, LocalTree
from crnet.tools.procs import stop_processes
from crnet.tune import model
from crnet.tune.workload import ComputeModel
from crnet.units import parse_bandwidth

from . import child_env
from .netns import EmulatedCluster, hosting
from .presets import Preset

NEVER = 1e9  # seconds: the compute time of a frozen host, for the model
CALIBRATION_ELEMENTS = 5000  # the small vector that gives the latency on unshaped links
# Benchmark schemes that are a crnet scheme with more crnetd options: name -> (scheme, options).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "cr-approx": ("cr", {"beyond_s": "approximate"})}


def crnetd_scheme(name: str, preset: Preset) -> tuple[str, dict[str, Any]]:
    """The crnet scheme a benchmark scheme runs, and the master's options it adds."""
    if name not in VARIANTS:
        return name, {}
    scheme, options = VARIANTS[name]
    if preset.patience is not None:
        options = {**options, "patience": preset.patience}
    return scheme, options


def preset_tree(preset: Preset, scheme: str) -> Tree:
    """The tree ``scheme`` runs on in this preset (``crnet.coding.plan.scheme_tree`` of its shapes)."""
    assert preset.cr_tree is not None and preset.gc_stragglers is not None, "resolve() the preset first"
    tree = preset.cr_tree
    if scheme == "tree" and preset.tree_shape:
        tree = preset.tree_shape
    elif scheme == "spread" and preset.spread_tree:
        tree = preset.spread_tree
    return scheme_tree(scheme, tree=tree, workers=preset.workers, stragglers=preset.gc_stragglers)


def run_crnet(cluster: EmulatedCluster, preset: Preset, scheme: str, workdir: Path,
              seed: int = 0, strict: bool = False,
              before_stop: Callable[[LocalTree], None] | None = None) -> dict:
    """One crnet scheme (or a ``VARIANTS`` one): daemons and emulated workers on the cluster's
    hosts. ``strict``: strict daemons, and a ``LaunchError`` naming each one that failed and
    its log. ``before_stop(tree)``: called once the workers are done, the daemons still up
    (``bench_tune`` asks them what they measured)."""
    return run_crnet_jobs(cluster, preset, scheme, workdir, [("", preset.steps)], seed, strict,
                          before_stop)[0]


def run_crnet_jobs(cluster: EmulatedCluster, preset: Preset, scheme: str, workdir: Path,
                   jobs: list[tuple[str, int]], seed: int = 0, strict: bool = False,
                   before_stop: Callable[[LocalTree], None] | None = None,
                   plan: str = "fixed",
                   between: Callable[[LocalTree], None] | None = None) -> list[dict]:
    """``run_crnet`` for each of ``jobs`` (job name, steps) in turn, on the same daemons
    (``plan``: the master's ``--plan``; with ``auto`` it may re-plan between them): a
    summary per job. ``between`` is called after each job but the last, ``before_stop``
    after the last."""
    row, (scheme, options) = scheme, crnetd_scheme(scheme, preset)
    tree = preset_tree(preset, scheme)
    names = list(tree.names())                   # master first, then workers breadth first
    host_of = {name: i for i, name in enumerate(names)}
    workdir.mkdir(parents=True, exist_ok=True)
    if plan != "fixed":
        options = dict(options, plan=plan)
    lt = LocalTree(tree, preset.samples, workdir=workdir, timeout=preset.timeout,
                   chunk_bytes=preset.chunk_bytes, scheme=scheme, log_level="warning",
                   keep_results=max(8, preset.steps), strict=strict, **options,
                   **hosting(cluster, names))
    out: list[dict] = []
    workers: list[subprocess.Popen] = []
    try:
        lt.start(wait=60)
        for j, (job, steps) in enumerate(jobs):
            daemons_cpu = cpu_seconds(p.pid for p in lt.procs.values())
            job_dir = workdir if len(jobs) == 1 else workdir / f"job{j}"
            job_dir.mkdir(parents=True, exist_ok=True)
            workers = []
            for i, name in enumerate(names):
                argv = [sys.executable, "-m", "benchmarks.worker", "--socket", lt.socket_path(name),
                        "--elements", str(preset.elements), "--steps", str(steps),
                        "--compute", preset.compute, "--seed", str(seed),
                        "--worker-index", str(i - 1), "--deadline", str(preset.deadline),
                        "--timeout", str(2 * preset.timeout + 5), "--out", str(job_dir / f"w{i}.json")]
                if job:
                    argv += ["--job", job]
                if scheme != row:
                    # A parent's patience counts from the step's start: without a start barrier,
                    # processes still starting up would make the first steps approximate.
                    argv += ["--barrier", str(len(names))]
                if name == MASTER:
                    argv.append("--observer")
                elif preset.persistent:
                    argv.append("--persistent-stragglers")
                elif preset.freeze and preset.freeze[0] == i - 1:
                    argv += ["--freeze-at", str(preset.freeze[1]),
                             "--daemon-pid", str(lt.procs[name].pid)]
                workers.append(_spawn_logged(cluster, host_of[name], argv, job_dir / f"w{i}.err"))
            # The observer (the master's client) sees every step; a frozen worker never exits.
            _wait(workers[:1], preset.deadline + 4 * preset.timeout + 30)
            _wait(workers[1:], 2 * preset.timeout + 5)
            daemons_cpu = cpu_seconds(p.pid for p in lt.procs.values()) - daemons_cpu
            stop_processes(workers, grace=5.0, term=False)   # what still runs is frozen or stuck
            out.append(_job_summary(row, preset, names, job_dir, daemons_cpu))
            if between is not None and j < len(jobs) - 1:
                between(lt)
        if before_stop is not None:
            before_stop(lt)
    finally:
        stop_processes(workers, grace=5.0, term=False)
        lt.stop()
    failed = lt.problems() if strict else []
    if failed:
        raise LaunchError(f"{row}: a daemon failed (--strict):\n" + "\n".join(failed))
    return out


def _job_summary(row: str, preset: Preset, names: list[str], workdir: Path, daemons_cpu: float) -> dict:
    records = [_read(workdir / f"w{i}.json") for i in range(len(names))]
    observer, rest = records[0], records[1:]
    times = observer.get("completion_times") or []
    steps = max(1, len([t for t in times if t is not None]))
    approx = observer.get("approximate") or []   # [step, coverage, residual] per approximate step
    return _summarise(row, times, preset,
                      correct=all(r.get("correct", False) for r in records if r),
                      approximate_steps=len(approx),
                      mean_coverage=float(np.mean([c for _, c, _ in approx])) if approx else None,
                      errors=[r["error"] for r in records if r and r.get("error")],
                      skipped=sum(r.get("skipped_compute", 0) for r in rest if r),
                      cpu_ms_per_step={"daemons": 1000 * daemons_cpu / steps / len(names),
                                       "clients": _client_cpu(records)})


def run_gloo_scheme(cluster: EmulatedCluster, preset: Preset, workdir: Path, seed: int = 0) -> dict:
    """PyTorch's Gloo all_reduce, one process per worker host, the same compute draws."""
    from .gloo_run import run_gloo

    loads = [a.local_samples for name, a in plan(Tree((preset.workers,), (0,)), preset.samples)
             .nodes.items() if name != MASTER]
    hosts = cluster.addresses[1:preset.workers + 1]
    workdir.mkdir(parents=True, exist_ok=True)

    def spawn(i: int, argv: list, env: dict) -> subprocess.Popen:
        return _spawn_logged(cluster, i + 1, argv, workdir / f"gloo{i}.err", env)

    out = run_gloo(spawn, hosts, [cluster.interface] * len(hosts), elements=preset.elements,
                   dtype="float32", steps=preset.steps, compute=preset.compute, loads=loads,
                   seed=seed, freeze=preset.freeze, deadline=preset.deadline,
                   timeout=max(preset.timeout, 5.0), workdir=workdir)
    first = out.get("first_step_s")
    times = out.get("step_times") or []
    record = _from_step_times("gloo", times, out.get("steps_completed", 0), preset,
                              correct=out.get("correct", False), errors=out.get("errors", []),
                              skipped=0)
    record["stalled"] = bool(out.get("stalled"))
    record["cpu_ms_per_step"] = {"processes": _client_cpu(out.get("records") or [])}
    record["first_step_s"] = first
    return record


def _summarise(scheme, completion_times, preset, **extra) -> dict:
    done = [t for t in completion_times if t is not None]
    # Step 0 includes start-up (connections, first shared memory): steady state from step 1.
    steady = [b - a for a, b in itertools.pairwise(completion_times)
              if a is not None and b is not None]
    return _from_step_times(scheme, steady, len(done), preset, **extra)


def _from_step_times(scheme, steady, completed, preset, **extra) -> dict:
    t = np.asarray(steady, dtype=np.float64)
    stats = ({"mean_s": float(t.mean()), "p50_s": float(np.median(t)),
              "p95_s": float(np.percentile(t, 95))} if len(t) else
             {"mean_s": None, "p50_s": None, "p95_s": None})
    return {"scheme": scheme, "steps_completed": completed, "steps": preset.steps,
            "step_times": t.tolist(), **stats, **extra}


def resolve(preset: Preset, seed: int = 0) -> tuple[Preset, dict]:
    """Fill in the model's best CR shape and GC s where the preset leaves them to it, and
    say what ``crnet plan --auto`` picks overall for this cluster."""
    ranking = model.rank(preset.workers, samples=preset.samples,
                         vector_bytes=preset.vector_bytes, bandwidth=_bandwidth(preset),
                         latency=preset.latency, compute=ComputeModel.parse(preset.compute),
                         seed=seed, chunk_bytes=chunk_bytes_for(preset.vector_bytes,
                                                                preset.chunk_bytes), top=10**6)
    best: dict[str, Tree] = {}  # each scheme's best shape (rar has none)
    for p in ranking:
        if p.tree is not None:
            best.setdefault(p.scheme, p.tree)
    preset = replace(preset,
                     cr_tree=preset.cr_tree or best["cr"],
                     tree_shape=preset.tree_shape or (best["tree"] if preset.cr_tree is None
                                                      else preset.cr_tree),
                     spread_tree=preset.spread_tree or (best["spread"] if preset.cr_tree is None
                                                        else preset.cr_tree),
                     gc_stragglers=(preset.gc_stragglers if preset.gc_stragglers is not None
                                    else best["gc"].stragglers[0]))
    pick = ranking[0]
    return preset, {"scheme": pick.scheme, "shape": pick.shape, "model_mean_s": pick.mean,
                    "tree": None if pick.tree is None else
                    [list(pick.tree.fanout), list(pick.tree.stragglers)]}


def calibrate(cluster: EmulatedCluster, preset: Preset, schemes, workdir: Path) -> dict:
    """Per-message latency of each implementation, from a ring run without compute; on
    unshaped links, also the rate a host moves bytes at.

    A zero-compute ring step is 2(N-1) rounds of (latency + M/(N B)); the measured
    step gives the latency that the model then uses for every scheme of that
    implementation (crnet's daemons, or Gloo). It is measured on this cluster, with
    this machine's two cores shared by every emulated host, not assumed.

    On an unshaped link (``preset.rate`` None) nothing but the hosts' CPUs bounds B, so B
    is measured too: the latency from a ring run of a small vector (whose bytes cost
    little), then B from the preset's vector, whose rounds cost latency + M/(N B). Returns
    ``{impl: {"latency_s": ..., "bandwidth_Bps": ...}}``.
    """
    quiet = replace(preset, compute="fixed:0", steps=10, freeze=None, name="calibrate")
    n, b = preset.workers, _bandwidth(preset)
    rounds = 2 * (n - 1)
    out = {}
    for impl, scheme in (("crnet", "rar"), ("gloo", "gloo")):
        if scheme == "gloo" and "gloo" not in schemes:
            continue
        full = _ring_step(cluster, scheme, quiet, workdir / f"calibrate-{scheme}")
        if not full:
            continue
        if preset.rate is not None:    # the shaper's rate: only the latency is fitted
            out[impl] = {"latency_s": max(full / rounds - preset.vector_bytes / n / b, 1e-6),
                         "bandwidth_Bps": b}
            continue
        small = replace(quiet, elements=CALIBRATION_ELEMENTS)
        step = _ring_step(cluster, scheme, small, workdir / f"calibrate-{scheme}-small")
        if not step:
            continue
        latency = max(step / rounds - small.vector_bytes / n / b, 1e-6)
        per_round = max(full / rounds - latency, 1e-6)   # (a run too noisy to tell: a floor)
        out[impl] = {"latency_s": latency, "bandwidth_Bps": preset.vector_bytes / n / per_round}
    return out


def _ring_step(cluster: EmulatedCluster, scheme: str, preset: Preset, workdir: Path) -> float | None:
    """The mean step of a ring run of ``preset``: crnet's (``rar``) or Gloo's."""
    r = (run_gloo_scheme(cluster, preset, workdir) if scheme == "gloo"
         else run_crnet(cluster, preset, "rar", workdir))
    return r["mean_s"]


def _bandwidth(preset: Preset) -> float:
    """The model's per-host link rate, bytes/s: calibrated where the preset has one, else
    its links' shaped rate (an unshaped link before calibration: 10 Gbit/s)."""
    if preset.bandwidth is not None:
        return preset.bandwidth
    return parse_bandwidth(preset.rate) if preset.rate else 1.25e9


def predict(preset: Preset, scheme: str, seed: int = 0, trials: int = 4000) -> dict:
    """The model's view of a scheme of the preset (gloo is a ring, like rar).

    ``mean_s``/``p50_s``/``p95_s``: expectation over the compute distribution
    (Monte-Carlo). ``same_draws_mean_s``: the model fed the very compute times the
    emulated workers drew in this run (steps 1..S-1), so measured and modelled
    differ only by what the model leaves out, not by the luck of 40 draws.
    """
    if scheme in VARIANTS:   # the model decodes exactly or waits: no approximate decodes
        return {"mean_s": None, "p50_s": None, "p95_s": None, "same_draws_mean_s": None}
    compute = ComputeModel.parse(preset.compute)
    kind = "rar" if scheme == "gloo" else scheme
    stragglers = preset.gc_stragglers
    assert stragglers is not None, "resolve() the preset first"
    # The shape and the network: the same for the expectation and for this run's draws.
    tree = preset_tree(preset, kind) if kind in ("cr", "spread", "tree") else None
    chunk_bytes = None if kind == "rar" else chunk_bytes_for(preset.vector_bytes, preset.chunk_bytes)
    bandwidth = _bandwidth(preset)
    p = model.predict(kind, tree=tree, workers=preset.workers, stragglers=stragglers,
                      vector_bytes=preset.vector_bytes, bandwidth=bandwidth, latency=preset.latency,
                      chunk_bytes=chunk_bytes, samples=preset.samples, compute=compute,
                      trials=trials, seed=seed)
    loads = model.worker_loads(preset_tree(preset, kind), preset.samples)
    draws = np.array([[compute.compute_time(int(load), seed, t, i) for i, load in enumerate(loads)]
                      for t in range(1, preset.steps)])
    if preset.freeze is not None:
        draws[preset.freeze[1] - 1:, preset.freeze[0]] = NEVER  # that host never answers again
    same = model.step_times_from_draws(kind, tree=tree, workers=preset.workers,
                                       stragglers=stragglers, vector_bytes=preset.vector_bytes,
                                       bandwidth=bandwidth, latency=preset.latency,
                                       chunk_bytes=chunk_bytes, compute_times=draws)
    # A scheme that must wait for the frozen host stalls: the model has no finite mean.
    same_mean = float(np.mean(same)) if np.all(same < NEVER / 2) else None
    return {"mean_s": p.mean, "p50_s": p.p50, "p95_s": p.p95, "same_draws_mean_s": same_mean}


def run_preset(preset: Preset, schemes, workdir: Path, seed: int = 0, log=print,
               calibrated: dict | None = None, strict: bool = False) -> dict:
    """All requested schemes of one preset on one cluster; returns the bench.json document."""
    results = {}
    given = preset
    preset, auto = resolve(preset, seed)   # (calibration's ring needs a resolved preset)
    with EmulatedCluster(preset.workers + 1, rate=preset.rate, burst=preset.burst) as cluster:
        if calibrated is None:
            calibrated = calibrate(cluster, preset, schemes, workdir)
            log("  calibrated: " + ", ".join(
                f"{k} latency {1e6 * v['latency_s']:.0f} us"
                + ("" if preset.rate else f", {v['bandwidth_Bps'] / 1e6:.0f} MB/s per host")
                for k, v in calibrated.items()))
        if preset.rate is None and "crnet" in calibrated:
            # Unshaped links: the CPUs bound the rate, and the shapes are chosen at the rate
            # crnet's ring measured, as a user would give `crnet plan --auto --bandwidth`.
            preset, auto = resolve(replace(given, bandwidth=calibrated["crnet"]["bandwidth_Bps"]),
                                   seed)
        cr = preset_tree(preset, "cr")
        spread = preset_tree(preset, "spread")
        log(f"  cr shape: fanout {list(cr.fanout)}, s {list(cr.stragglers)}; spread's: fanout "
            f"{list(spread.fanout)}, s {list(spread.stragglers)}; "
            f"tree fanout {list(preset_tree(preset, 'tree').fanout)}; gc s = "
            f"{preset.gc_stragglers}; plan --auto picks {auto['scheme']} ({auto['shape']})")
        for scheme in schemes:
            started = time.monotonic()
            if scheme == "gloo":
                results[scheme] = run_gloo_scheme(cluster, preset, workdir / scheme, seed)
            else:
                results[scheme] = run_crnet(cluster, preset, scheme, workdir / scheme, seed,
                                            strict)
            impl = calibrated.get("gloo" if scheme == "gloo" else "crnet", {})
            latency = impl.get("latency_s", preset.latency)
            bandwidth = impl.get("bandwidth_Bps", _bandwidth(preset))
            results[scheme]["model"] = predict(replace(preset, latency=latency,
                                                       bandwidth=bandwidth), scheme, seed)
            results[scheme]["model"].update(latency_s=latency, bandwidth_Bps=bandwidth)
            r = results[scheme]
            cpu = ", ".join(f"{who} {ms:.1f} ms" for who, ms in r.get("cpu_ms_per_step", {}).items()
                            if ms is not None)
            log(f"  {scheme:5} {r['steps_completed']:>3}/{preset.steps} steps, mean "
                f"{ms(r['mean_s'])}, model {ms(r['model']['mean_s'])} "
                f"({time.monotonic() - started:.0f} s); CPU per step and host: {cpu or '-'}"
                + (f"; {r['approximate_steps']} approximate steps, mean coverage "
                   f"{r['mean_coverage']:.3f}" if r.get("approximate_steps") else ""))
    return {"preset": preset.name, "about": preset.about, "config": _config(preset),
            "calibrated": calibrated, "plan_auto": auto, "schemes": results}


def _config(p: Preset) -> dict:
    cr = preset_tree(p, "cr")
    return {"workers": p.workers, "cr_fanout": list(cr.fanout),
            "tree_fanout": list(preset_tree(p, "tree").fanout),
            "cr_stragglers": list(cr.stragglers), "gc_stragglers": p.gc_stragglers,
            "spread_fanout": list(preset_tree(p, "spread").fanout),
            "spread_stragglers": list(preset_tree(p, "spread").stragglers),
            "samples": p.samples, "elements": p.elements, "vector_bytes": p.vector_bytes,
            "rate": p.rate, "compute": p.compute, "steps": p.steps, "freeze": p.freeze,
            "deadline_s": p.deadline, "timeout_s": p.timeout, "latency_s": p.latency,
            "persistent_stragglers": p.persistent, "burst": p.burst, "patience_s": p.patience}


def ms(x) -> str:
    """Seconds as milliseconds for a table (``-`` for None)."""
    return "   -   " if x is None else f"{1e3 * x:7.1f} ms"


def _spawn_logged(cluster, host: int, argv, log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start ``argv`` (a ``python -m benchmarks.<module>``) on ``host``, stderr to ``log``."""
    with open(log, "wb") as err:  # the child keeps its own copy of the descriptor
        return cluster.popen(host, argv, stdout=subprocess.DEVNULL, stderr=err,
                             env=child_env() if env is None else env)


def _wait(procs, limit: float) -> None:
    deadline = time.monotonic() + limit
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.1, deadline - time.monotonic()))


def cpu_seconds(pids) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue   # gone: it counts nothing more
        total += int(fields[11]) + int(fields[12])   # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def _client_cpu(records) -> float | None:
    """Mean CPU ms per steady step of the processes that wrote ``cpu_steady_s`` (step 1 on)."""
    per = [1000 * r["cpu_steady_s"] / r["cpu_steps"] for r in records if r and r.get("cpu_steps")]
    return sum(per) / len(per) if per else None


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_sweep(base: Preset, schemes, workdir: Path, seed: int = 0, log=print,
              strict: bool = False) -> list[dict]:
    """Straggle probability x slowdown: CR's measured and modelled speedups over the ring."""
    from .presets import sweep_points

    points = []
    calibrated = None
    for k, preset in enumerate(sweep_points(base)):
        log(f"{preset.name}")
        doc = run_preset(preset, schemes, workdir / f"sweep{k}", seed, log, calibrated, strict)
        calibrated = doc["calibrated"]  # the same cluster shape: calibrate once
        compute = ComputeModel.parse(preset.compute)
        points.append({"prob": compute.prob, "factor": compute.factor, "schemes": doc["schemes"]})
    return points
