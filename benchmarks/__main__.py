"""``python -m benchmarks``: every scheme and PyTorch's Gloo on an emulated cluster (root).

Run from the clone's root (these benchmarks are not part of the installed ``crnet``):
``python -m benchmarks --preset quick``. It builds one cluster of network namespaces per
preset (``presets.py``, ``netns.py``), runs every scheme on it (``runner.py``) and writes
bench.json, the tables and the plot (``report.py``).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import click

from crnet.config.types import UnitValue
from crnet.errors import LaunchError
from crnet.units import parse_bytes

from . import report
from .netns import requirements
from .presets import PRESETS
from .runner import run_preset, run_sweep


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--preset", "presets", multiple=True, default=["stragglers"], show_default=True,
              type=click.Choice(list(PRESETS)),
              help="Scenario (repeatable).")
@click.option("--schemes", default=",".join(report.ORDER), show_default=True,
              help="Comma list of cr, spread, gc, tree, rar and gloo (PyTorch's ring allreduce), "
                   "and cr-approx (cr with crnetd's --beyond-s approximate, e.g. --preset "
                   "correlated --schemes cr,cr-approx).")
@click.option("--sweep", is_flag=True,
              help="Also sweep straggle probability x slowdown (stragglers preset; cr, spread, "
                   "rar, gloo).")
@click.option("--persistent-stragglers", is_flag=True,
              help="crnet's emulated workers finish every computation, as a loop that cannot "
                   "stop mid-step would (default: they stop once the tree finished the step).")
@click.option("--steps", type=click.IntRange(min=3), default=None, help="Override the preset's steps.")
@click.option("--burst", type=UnitValue("SIZE", parse_bytes), default=None,
              help="Every link's tbf bucket (default: 4 ms of the link's rate, at least 96KiB, "
                   "which holds a whole GSO packet; smaller, tbf segments packets in software).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default="bench.json", show_default=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default="bench.png",
              show_default=True)
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Keep daemon logs and raw results here (default: a temporary directory).")
@click.option("--json", "as_json", is_flag=True, help="End with a summary as one JSON line.")
@click.option("--strict", is_flag=True,
              help="Strict daemons: an internal error stops one (exit 70) and fails the run, "
                   "naming the daemon and its log (kept); the tests run this way.")
def main(presets, schemes, sweep, persistent_stragglers, steps, burst, seed, out, plot_path,
         workdir, as_json, strict):
    """Every scheme and PyTorch's Gloo on an emulated cluster (root: network namespaces).

    Run from the clone's root (the benchmarks/ package is not part of the installed
    crnet), installed with pip install -e '.[bench]': python -m benchmarks --preset quick
    """
    chosen = [s.strip() for s in schemes.split(",") if s.strip()]
    unknown = set(chosen) - set(report.ROWS)
    if unknown or "cr" not in chosen:
        raise click.UsageError(f"--schemes must include cr and only {', '.join(report.ORDER)} "
                               f"or {', '.join(report.APPROX)} (got {schemes!r})")
    problem = requirements()
    if problem:
        raise click.ClickException(f"python -m benchmarks emulates hosts with network namespaces: "
                                   f"{problem}")
    if "gloo" in chosen:
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            click.echo("note: torch is not installed, skipping gloo (pip install torch==2.13.0)",
                       err=True)
            chosen.remove("gloo")
    tmp = None
    if workdir is None:
        workdir = tmp = tempfile.mkdtemp(prefix="crnet-bench-")
    try:
        docs = []
        for name in presets:
            preset = PRESETS[name]
            if steps is not None:
                preset = dataclasses.replace(preset, steps=steps)
            if persistent_stragglers:
                preset = dataclasses.replace(preset, persistent=True)
            if burst is not None:
                preset = dataclasses.replace(preset, burst=str(int(burst)))
            click.echo(f"{name}: {preset.about}", err=True)
            docs.append(run_preset(preset, chosen, Path(workdir) / name, seed,
                                   log=lambda m: click.echo(m, err=True), strict=strict))
            Path(out).write_text(json.dumps({"presets": docs, "sweep": None}, indent=1))
        points = None
        if sweep:
            sweep_schemes = [s for s in ("cr", "spread", "rar", "gloo") if s in chosen]
            points = run_sweep(PRESETS["stragglers"], sweep_schemes, Path(workdir) / "sweep", seed,
                               log=lambda m: click.echo(m, err=True), strict=strict)
    except LaunchError as e:   # --strict: a daemon failed; its log stays where e names it
        tmp = None
        raise click.ClickException(str(e)) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    for doc in docs:
        click.echo(report.table(doc))
        click.echo()
    if points:
        click.echo(report.sweep_table(points))
    Path(out).write_text(json.dumps({"presets": docs, "sweep": points}, indent=1))
    why = report.plot(docs, points, Path(plot_path))
    click.echo(f"wrote {out}" + (f" and {plot_path}" if why is None else f" (no plot: {why})"),
               err=True)
    if as_json:
        click.echo(json.dumps(report.summary(docs[-1])))


if __name__ == "__main__":
    main(prog_name="python -m benchmarks")
