"""``crnet demo``: logistic regression on a local tree of real daemons, with stragglers."""

from __future__ import annotations

import functools
import json

import click

from ..config.tree import tree_for_scheme
from ..errors import CrnetError
from ..units import plural
from .shared import csv, scheme_options, tree_options


@click.command(short_help="Train logistic regression on a local tree, with stragglers.")
@scheme_options
@tree_options
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True,
              help="Gradient descent steps (each one allreduce over the tree).")
@click.option("--samples", "-m", type=click.IntRange(min=1), default=6000, show_default=True,
              help="Samples in the (full) batch.")
@click.option("--features", type=click.IntRange(min=1), default=20, show_default=True,
              help="Features per sample: the length of the gradient vector.")
@click.option("--straggle-prob", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="Chance that a worker straggles in a step.")
@click.option("--straggle-factor", type=click.FloatRange(min=1), default=5.0, show_default=True,
              help="A straggling worker takes this many times its compute time.")
@click.option("--compute-ms", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="Emulated minimum compute time of a worker's step.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="The daemons' --timeout: seconds a step may wait for its quorum.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the synthetic data and of who straggles when.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary as one JSON line on stdout (the table goes to stderr).")
@click.option("--strict", is_flag=True,
              help="Strict daemons: an internal error stops one (exit 70) and fails the demo, "
                   "naming the daemon and its log (the tests run this way).")
def demo(scheme, workers, fanout, layers, stragglers, steps, samples, features, straggle_prob,
         straggle_factor, compute_ms, timeout, seed, as_json, strict):
    """Train logistic regression on a local tree of real crnetd processes, with stragglers."""
    from ..tools.demo import DemoConfig, run_demo

    tree = tree_for_scheme(scheme, workers, fanout, layers, stragglers)
    cfg = DemoConfig(fanout=tree.fanout, stragglers=tree.stragglers, scheme=scheme, steps=steps,
                     samples=samples,
                     features=features, straggle_prob=straggle_prob,
                     straggle_factor=straggle_factor, compute_ms=compute_ms, timeout=timeout,
                     seed=seed, strict=strict)
    click.echo(f"crnet demo ({scheme}): {plural(tree.workers, 'worker')} + master (fanout "
               f"{csv(tree.fanout)}, stragglers {csv(tree.stragglers)}), "
               f"{plural(steps, 'step')} of full-batch gradient descent on "
               f"{plural(samples, 'sample')} x {plural(features, 'feature')}", err=True)
    try:
        summary = run_demo(cfg)
    except (CrnetError, OSError) as e:
        raise click.ClickException(str(e)) from None
    ok = summary["max_rel_error"] <= 1e-6
    # With --json, stdout carries only the JSON (`crnet demo --json | jq .`); the table goes to stderr.
    say = functools.partial(click.echo, err=as_json)
    say(f"steps               {summary['steps']}")
    say(f"mean step time      {1e3 * summary['mean_step_s']:.1f} ms")
    say(f"stragglers injected {summary['stragglers_injected']}")
    skipped = ("hosts each owner decoded without, added up" if scheme == "spread"
               else "children a parent decoded without")
    say(f"stragglers skipped  {summary['stragglers_skipped']} ({skipped})")
    say(f"final loss          {summary['final_loss']:.6f}")
    say(f"max rel. difference {summary['max_rel_error']:.2e} vs single-process gradient "
        f"descent ({'exact' if ok else 'TOO LARGE'})")
    if as_json:
        keys = ("steps", "mean_step_s", "max_rel_error", "stragglers_skipped",
                "stragglers_injected", "final_loss")
        click.echo(json.dumps({k: summary[k] for k in keys}))
    if not ok:
        raise SystemExit(1)

