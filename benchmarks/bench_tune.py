"""``python -m benchmarks.bench_tune``: does ``crnet tune`` pick well from what it measured?

Issue 28's check, per preset (root: an emulated cluster, ``netns.py``):

1. a job starts with a deliberately poor configuration (``--start``, per preset) and runs
   ``--start-steps`` steps;
2. ``crnet tune MASTER --json`` (the CLI, as an operator runs it, from the master's host)
   gathers the daemons' windows, fits the model and ranks every scheme and shape;
3. the configuration it ranks first runs the preset's steps, and so does every scheme at
   the shape the model picks for it from the preset's own numbers (what ``python -m
   benchmarks`` runs), all on the same cluster in the same run.

The table gives the tuned pick's measured mean against the best measured (target: within
10%), and tune's prediction for the running (poor) configuration against what it measured
(target: within 20%). Every row's results are checked exact by the workers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import click

from crnet.coding.plan import Tree
from crnet.errors import LaunchError
from crnet.tools.launch import MASTER, LocalTree

from . import child_env
from .netns import EmulatedCluster, requirements
from .presets import PRESETS, Preset
from .runner import ms, preset_tree, resolve, run_crnet, run_crnet_jobs

SCHEMES = ("cr", "spread", "gc", "tree", "rar")
# A start each preset's measurements show to be poor (docs/benchmarks.md): the ring waits
# for every straggler; CodedReduce's tree moves n vectors per parent on slow links.
POOR = {"stragglers": "rar", "large": "rar", "bandwidth": "cr:4,4:1,1", "heavy-tail": "gc:3",
        "correlated": "rar"}


def parse_config(text: str) -> tuple[str, Tree | None, int | None]:
    """``rar``, ``gc:S`` or ``SCHEME:FANOUT:S`` (``cr:4,4:1,1``): scheme, tree, gc's s."""
    scheme, _, rest = text.partition(":")
    if scheme not in SCHEMES:
        raise click.BadParameter(f"{text!r}: the scheme is one of {', '.join(SCHEMES)}")
    if scheme == "rar":
        return scheme, None, None
    if scheme == "gc":
        return scheme, None, int(rest or 0)
    fanout, _, s = rest.partition(":")
    try:
        f = tuple(int(x) for x in fanout.split(","))
        st = tuple(int(x) for x in s.split(",")) if s else (0,) * len(f)
        return scheme, Tree(f, st), None
    except ValueError as e:
        raise click.BadParameter(f"{text!r}: {e}") from None


def configured(preset: Preset, scheme: str, tree: Tree | None, gc_s: int | None) -> Preset:
    """``preset`` (resolved) with ``scheme`` running on ``tree`` (or gc with s = ``gc_s``)."""
    if scheme == "cr":
        return replace(preset, cr_tree=tree)
    if scheme == "tree":
        return replace(preset, tree_shape=tree)
    if scheme == "spread":
        return replace(preset, spread_tree=tree)
    if scheme == "gc":
        return replace(preset, gc_stragglers=gc_s)
    return preset


def picked(entry: dict) -> tuple[str, Tree | None, int | None]:
    """A ranking entry of ``crnet tune --json`` as (scheme, tree, gc's s)."""
    scheme = entry["scheme"]
    if scheme == "rar":
        return scheme, None, None
    tree = Tree(tuple(entry["fanout"]), tuple(entry["stragglers"]))
    if scheme == "gc":
        return scheme, None, tree.stragglers[0]
    return scheme, tree, None


def describe(scheme: str, tree: Tree | None, gc_s: int | None) -> str:
    if scheme == "rar":
        return "rar"
    if scheme == "gc":
        return f"gc s {gc_s}"
    assert tree is not None
    return (f"{scheme} {','.join(map(str, tree.fanout))}:"
            f"{','.join(map(str, tree.stragglers))}")


def ask_tune(cluster, lt: LocalTree, out: dict) -> None:
    """``crnet tune`` from the master's host, as an operator would run it."""
    address = f"{lt.addresses[MASTER]}:{lt.ports[MASTER]}"
    argv = [sys.executable, "-m", "crnet", "tune", address, "--json", "--top", "5"]
    if (lt.workdir / "secret").exists():
        argv += ["--secret-file", str(lt.workdir / "secret")]
    p = cluster.popen(0, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
    stdout, stderr = p.communicate(timeout=300)
    if p.returncode != 0:
        raise LaunchError(f"crnet tune exited {p.returncode}: {stderr.decode(errors='replace')}")
    out.update(json.loads(stdout))


def run_one(preset: Preset, start: str, start_steps: int, schemes, workdir: Path, seed: int,
            strict: bool, log, plan_auto: bool = False) -> dict:
    """``run_on`` a new emulated cluster of the preset's hosts and links."""
    with EmulatedCluster(preset.workers + 1, rate=preset.rate, burst=preset.burst) as cluster:
        return run_on(cluster, preset, start, start_steps, schemes, workdir, seed, strict, log,
                      plan_auto)


def config_of(entry: dict | None) -> str:
    """A ``crnet tune --json`` entry (None: the running plan) as ``describe`` says it."""
    return "-" if entry is None else describe(*picked(entry))


def run_auto(cluster, preset: Preset, start: str, start_steps: int, workdir: Path, seed: int,
             strict: bool) -> dict:
    """Issue 28's second check: the poor start with ``crnetd --plan auto``; job ``start``
    runs ``start_steps`` steps, then job ``next`` the preset's steps on the same daemons
    (the master re-plans between them by itself). Job ``next``'s row, with the
    configuration it ran (``crnet tune --json`` after it) and the one ``crnet tune`` said
    between the jobs that ``--plan auto`` would run (its ``plan_auto``)."""
    s_scheme, s_tree, s_gc = parse_config(start)
    poor = configured(preset, s_scheme, s_tree, s_gc)
    before: dict = {}
    after: dict = {}
    rows = run_crnet_jobs(cluster, poor, s_scheme, workdir / "auto",
                          [("start", start_steps), ("next", preset.steps)], seed, strict,
                          before_stop=lambda lt: ask_tune(cluster, lt, after), plan="auto",
                          between=lambda lt: ask_tune(cluster, lt, before))
    ran = config_of(after["running"])
    said = config_of(before["plan_auto"]) if before["plan_auto"] else describe(s_scheme, s_tree, s_gc)
    return {**rows[1], "config": ran, "tune_said": said, "start_mean_s": rows[0]["mean_s"],
            "exact_both": all(r.get("correct") for r in rows)}


def run_on(cluster, preset: Preset, start: str, start_steps: int, schemes, workdir: Path,
           seed: int, strict: bool, log, plan_auto: bool = False) -> dict:
    """The poor start, ``crnet tune``, its pick and every scheme of ``schemes`` on ``cluster``
    (an ``EmulatedCluster``, or anything with its ``addresses`` and ``popen``); with
    ``plan_auto``, ``run_auto`` too."""
    preset, _ = resolve(preset, seed)
    s_scheme, s_tree, s_gc = parse_config(start)
    poor = replace(configured(preset, s_scheme, s_tree, s_gc), steps=start_steps)
    rows: dict[str, dict] = {}
    tuning: dict = {}
    r = run_crnet(cluster, poor, s_scheme, workdir / "start", seed, strict,
                  before_stop=lambda lt: ask_tune(cluster, lt, tuning))
    rows["start"] = {**r, "config": describe(s_scheme, s_tree, s_gc)}
    log(f"  start {rows['start']['config']}: {start_steps} steps, mean {ms(r['mean_s'])}; "
        f"tune measured {ms(tuning['measured']['mean'])}, predicts "
        f"{ms(tuning['running']['mean'])}, ranks it {tuning['running']['rank']} of "
        f"{tuning['candidates']}")
    best = picked(tuning["ranking"][0])
    r = run_crnet(cluster, configured(preset, *best), best[0], workdir / "tuned", seed, strict)
    rows["tuned"] = {**r, "config": describe(*best), "model_mean_s": tuning["ranking"][0]["mean"]}
    log(f"  tuned {rows['tuned']['config']}: mean {ms(r['mean_s'])} (tune predicts "
        f"{ms(tuning['ranking'][0]['mean'])})")
    for scheme in schemes:
        r = run_crnet(cluster, preset, scheme, workdir / scheme, seed, strict)
        tree = None if scheme in ("rar", "gc") else preset_tree(preset, scheme)
        rows[scheme] = {**r, "config": describe(scheme, tree, preset.gc_stragglers)}
        log(f"  {rows[scheme]['config']}: mean {ms(r['mean_s'])}")
    if plan_auto:
        r = rows["auto"] = run_auto(cluster, preset, start, start_steps, workdir, seed, strict)
        log(f"  --plan auto: job 2 ran {r['config']} (crnet tune after job 1: {r['tune_said']}): "
            f"mean {ms(r['mean_s'])} (job 1, {rows['start']['config']}: "
            f"{ms(r['start_mean_s'])}), exact: {r['exact_both']}")
    return {"preset": preset.name, "start": start, "tune": tuning, "rows": rows}


def _schemes_done(rows: dict) -> dict:
    """The rows of the schemes run to find the best (not the start, the pick or --plan
    auto's job) that completed every step."""
    return {k: r for k, r in rows.items() if k not in ("start", "tuned", "auto") and r["mean_s"]
            and r["steps_completed"] == r["steps"]}


def summary(doc: dict) -> list[str]:
    rows = doc["rows"]
    done = _schemes_done(rows)
    best = min(done, key=lambda k: done[k]["mean_s"]) if done else None
    tuned, start, t = rows["tuned"], rows["start"], doc["tune"]
    ratio = (tuned["mean_s"] / done[best]["mean_s"]) if best and tuned["mean_s"] else None
    pred = t["running"]["mean"] / t["measured"]["mean"] if t["measured"]["mean"] else None
    exact = all(r.get("correct") for r in rows.values())
    return [f"{doc['preset']:<11} {start['config']:<14} {ms(t['measured']['mean'])} "
            f"{ms(t['running']['mean'])} {_x(pred)}   {tuned['config']:<18} {ms(tuned['mean_s'])}"
            f"   {(rows[best]['config'] if best else '-'):<18} {ms(done[best]['mean_s'] if best else None)}"
            f" {_x(ratio)}   {'yes' if exact else 'NO'}"]


def auto_summary(doc: dict) -> str | None:
    """The ``--plan-auto`` row: job 2's configuration and mean against tune's pick and the
    best measured (``summary``'s), and whether both jobs were exact."""
    rows = doc["rows"]
    auto = rows.get("auto")
    if auto is None:
        return None
    best = min((r["mean_s"] for r in _schemes_done(rows).values()), default=None)
    ratio = auto["mean_s"] / best if best and auto["mean_s"] else None
    return (f"{doc['preset']:<11} {rows['start']['config']:<14} {ms(auto['start_mean_s'])}   "
            f"{auto['tune_said']:<18} {auto['config']:<18} {ms(auto['mean_s'])} "
            f"{_x(ratio)}   {'yes' if auto['exact_both'] else 'NO'}")


AUTO_HEAD = ("preset      job 1 (start)  measured     tune: plan auto    job 2 ran          "
             "measured   job2/best  exact")


def _x(x) -> str:
    return "   -  " if x is None else f"{x:5.2f}x"


HEAD = ("preset      start          measured   predicted  pred/meas   tune's pick        "
        "measured     best measured      mean       tuned/best  exact")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--preset", "presets", multiple=True, default=["stragglers", "bandwidth", "large"],
              show_default=True, type=click.Choice(list(PRESETS)), help="Scenario (repeatable).")
@click.option("--start", "starts", multiple=True, metavar="PRESET=CONFIG",
              help="The poor start for a preset: rar, gc:S or SCHEME:FANOUT:S (cr:4,4:1,1); "
                   f"default {', '.join(f'{k}={v}' for k, v in POOR.items())}.")
@click.option("--start-steps", type=click.IntRange(min=3), default=30, show_default=True,
              help="Steps of the poor start before crnet tune asks.")
@click.option("--schemes", default=",".join(SCHEMES), show_default=True,
              help="The schemes run to find the best (each at the model's shape for the preset).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default="bench_tune.json", show_default=True)
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Keep daemon logs and raw results here (default: a temporary directory).")
@click.option("--strict", is_flag=True, help="Strict daemons: an internal error fails the run.")
@click.option("--plan-auto", is_flag=True,
              help="Also start the poor configuration with crnetd --plan auto and run a second job "
                   "on the same daemons: what the master re-planned to by itself.")
def main(presets, starts, start_steps, schemes, seed, out, workdir, strict, plan_auto):
    """crnet tune's pick against every scheme measured in the same run (root)."""
    missing = requirements()
    if missing:
        raise click.ClickException(missing)
    chosen = dict(POOR)
    for s in starts:
        name, eq, config = s.partition("=")
        if not eq or name not in PRESETS:
            raise click.BadParameter(f"{s!r}: PRESET=CONFIG with a preset of {', '.join(PRESETS)}",
                                     param_hint="--start")
        parse_config(config)
        chosen[name] = config
    names = [s for s in schemes.split(",") if s]
    for s in names:
        if s not in SCHEMES:
            raise click.BadParameter(f"{s!r}: one of {', '.join(SCHEMES)}", param_hint="--schemes")
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="crnet-tune-"))
    docs = []
    try:
        for name in presets:
            click.echo(f"preset {name}: start {chosen.get(name, 'rar')}, {start_steps} steps")
            docs.append(run_one(PRESETS[name], chosen.get(name, "rar"), start_steps, names,
                                base / name, seed, strict, click.echo, plan_auto))
    except LaunchError as e:
        raise click.ClickException(str(e)) from None
    finally:
        if workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    Path(out).write_text(json.dumps(docs, indent=1))
    click.echo("\n" + HEAD)
    for d in docs:
        for line in summary(d):
            click.echo(line)
    autos = [line for line in map(auto_summary, docs) if line]
    if autos:
        click.echo("\n" + AUTO_HEAD)
        for line in autos:
            click.echo(line)


if __name__ == "__main__":
    main()
