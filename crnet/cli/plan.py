"""``crnet plan``: who computes which samples; with --auto, tree shapes ranked by the model."""

from __future__ import annotations

import json

import click

from ..coding.plan import Tree
from ..coding.plan import plan as make_plan
from ..config.tree import resolve_layers, tree_from_options
from ..units import plural
from .model import (
    MODEL_OPTIONS,
    inputs_json,
    inputs_text,
    model_options,
    prediction_table,
    warn_if_absurd,
)
from .shared import csv, tree_options, typed


@click.command(short_help="Show who computes which samples, or rank tree shapes (--auto).")
@tree_options
@click.option("--samples", "-m", type=click.IntRange(min=1), default=None,
              help="Samples in the global batch (required; with --auto, default 60000).")
@click.option("--code", "code_kind", type=click.Choice(["auto", "frc", "crc"]), default="auto",
              show_default=True, help="Gradient code at every parent.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--auto", is_flag=True,
              help="Rank schemes and tree shapes for --hosts workers by predicted step time.")
@click.option("--hosts", type=click.IntRange(min=1), default=None,
              help="--auto: workers to arrange (the master is extra).")
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True,
              help="--auto: how many of the best to print.")
@click.option("--max-layers", type=click.IntRange(1, 4), default=3, show_default=True,
              help="--auto: deepest tree tried.")
@model_options
@click.pass_context
def plan(ctx, fanout, layers, stragglers, samples, code_kind, as_json, auto, hosts, top,
         max_layers, **inputs):
    """Show the CodedReduce allocation: who computes which samples.

    With --auto, rank schemes (cr, spread, gc, tree, rar) and tree shapes for --hosts workers by
    the run-time model's predicted mean step time instead (the --vector-bytes ... options).
    """
    if auto or hosts is not None:
        plan_auto(ctx, auto, hosts, samples, top, max_layers, as_json, inputs)
        return
    given = typed(ctx, MODEL_OPTIONS + ("top", "max_layers"))
    if given:
        raise click.UsageError(f"{given[0]} is for --auto")
    if samples is None:
        raise click.MissingParameter(ctx=ctx, param=next(p for p in ctx.command.params
                                                         if p.name == "samples"))
    tree = tree_from_options(fanout, resolve_layers(fanout, layers, stragglers), stragglers)
    try:
        p = make_plan(tree, samples, code_kind)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    idle = [a.name for a in p.nodes.values() if a.name and not a.local_samples]
    if idle:   # fewer samples than workers: some compute nothing, and no error says so
        why = " (fewer samples than workers)" if samples < tree.workers else ""
        click.echo(f"warning: --samples {samples} leaves {len(idle)} of the "
                   f"{plural(tree.workers, 'worker')} with no samples to compute{why}: "
                   f"{', '.join(idle[:4])}{', ...' if len(idle) > 4 else ''}", err=True)
    if as_json:
        click.echo(json.dumps(p.to_json()))
        return
    click.echo(f"tree        fanout {csv(tree.fanout)}, stragglers {csv(tree.stragglers)}, "
               f"{plural(tree.layers, 'layer')}")
    click.echo(f"workers     N = {tree.workers} (+ the master)")
    click.echo(f"load        d* = {p.optimal_load:.6g} of the batch "
               f"({p.optimal_load * samples:.1f} of {plural(samples, 'sample')}); "
               f"max local {p.max_local_samples} (uncoded: {samples / tree.workers:.1f})")
    for l, (n, s) in enumerate(zip(tree.fanout, tree.stragglers), start=1):
        click.echo(f"resiliency  layer {l}: any {s} of the {n} children of every parent may "
                   f"straggle ({_code_name(tree, l, code_kind)} code)")
    click.echo(f"master      receives {plural(tree.fanout[0], 'vector')} per step "
               f"(gradient coding: {tree.workers})")
    click.echo()
    rows = [(a.name or "(master)", str(a.layer), str(a.local_samples), _ranges(a.local),
             _ranges(a.responsibility)) for a in p.nodes.values()]
    header = ("node", "layer", "local", "local ranges", "responsibility")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])


def _code_name(tree: Tree, layer: int, code_kind: str) -> str:
    first_parent_of_layer = ".".join(["0"] * (layer - 1))
    code = tree.code_of(first_parent_of_layer, code_kind)
    assert code is not None  # layer <= tree.layers: its parents have children
    return code.kind


def _ranges(ranges, limit: int = 4) -> str:
    if not ranges:
        return "-"
    shown = [f"{a}:{b}" + ("" if w == 1.0 else f"x{w:.4g}") for a, b, w in ranges[:limit]]
    if len(ranges) > limit:
        shown.append(f"... (+{len(ranges) - limit})")
    return " ".join(shown)


def plan_auto(ctx, auto, hosts, samples, top, max_layers, as_json, inputs) -> None:
    """``crnet plan --auto``: the best schemes and shapes for ``hosts`` workers."""
    from ..tune.model import Prediction, candidates, rank

    if not auto:
        raise click.UsageError("--hosts is for --auto")
    if hosts is None:
        raise click.UsageError("--auto needs --hosts N (the number of workers)")
    given = typed(ctx, ("fanout", "layers", "stragglers", "code_kind"))
    if given:
        raise click.UsageError(f"--auto searches the tree shapes itself: drop {given[0]}")
    samples = 60000 if samples is None else samples
    try:
        ranked = rank(hosts, samples=samples, max_layers=max_layers, top=None, **inputs)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    warn_if_absurd(ranked[:top])
    count = len(candidates(hosts, max_layers))
    best_of: dict[str, Prediction] = {}
    for p in ranked:
        best_of.setdefault(p.scheme, p)
    if as_json:
        doc = {"hosts": hosts, **inputs_json(samples, inputs), "candidates": count,
               "ranking": [p.to_json() for p in ranked[:top]],
               "best_per_scheme": {name: p.to_json() for name, p in best_of.items()}}
        click.echo(json.dumps(doc))
        return
    click.echo(f"hosts       {plural(hosts, 'worker')} (+ the master): {count} schemes and "
               "shapes tried")
    click.echo(f"model       {inputs_text(samples, inputs)}")
    click.echo()
    prediction_table(ranked[:top], numbered=True)
    others = [p for p in best_of.values() if p not in ranked[:top]]
    if others:
        click.echo()
        click.echo("best of the other schemes:")
        prediction_table(others, numbered=False, header=False,
                          ranks=[ranked.index(p) + 1 for p in others])
