"""``crnet model``: each scheme's predicted step time (the run-time model, ``crnet.tune.model``),
and the model's inputs and tables ``crnet plan --auto`` shares."""

from __future__ import annotations

import json

import click

from ..coding.plan import SCHEMES
from ..config.tree import resolve_layers, stragglers_in_effect, tree_from_options
from ..config.types import ComputeSpec, UnitValue
from ..units import parse_bandwidth, parse_bytes, parse_seconds
from .shared import tree_options


def model_options(f):
    """The run-time model's inputs (``crnet.tune.model``): ``crnet model`` and ``crnet plan --auto``."""
    size = UnitValue("SIZE", parse_bytes)
    options = [
        click.option("--vector-bytes", type=size, default="4MB", show_default=True,
                     help="Gradient vector size: 20000, 20kB, 4MB, 1MiB."),
        click.option("--bandwidth", type=UnitValue("RATE", parse_bandwidth), default="1Gbit",
                     show_default=True, help="Every host's full-duplex link: 100Mbit, 1Gbit "
                                             "(bits/s) or 12.5MB (bytes/s)."),
        click.option("--latency", type=UnitValue("TIME", parse_seconds), default="50us",
                     show_default=True, help="One-way latency per message: 50us, 0.2ms, 1s."),
        click.option("--compute", type=ComputeSpec(), default="straggle:1e-5,0.1,5",
                     show_default=True,
                     help="A worker's compute time per step, A = time per sample (20us, "
                          "0.02ms; a plain number is seconds): fixed:A, straggle:A,P,F (slowed "
                          "F times with probability P), grouped:A,P,F,G (the same for groups of "
                          "G consecutive workers at once: correlated stragglers), "
                          "shifted-exp:A,MU (A plus an exponential time of rate MU per second, "
                          "mean 1/MU s per sample: 1e5, 1e5/s, 100/ms), empirical:A,FILE (FILE: "
                          "multipliers or measured step times, one per line, divided by their "
                          "minimum)."),
        click.option("--chunk-bytes", type=size, default=None,
                     help="Model pipelining in chunks of this size (crnetd's default grows with the "
                          "vector, 1-4 MiB); default: whole vectors, store and forward."),
        click.option("--trials", type=click.IntRange(min=1), default=2000, show_default=True,
                     help="Simulated steps per scheme."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the simulated compute times."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


MODEL_OPTIONS = ("vector_bytes", "bandwidth", "latency", "compute", "chunk_bytes", "trials", "seed")


@click.command("model", short_help="Predict each scheme's step time (the run-time model).")
@click.option("--scheme", type=click.Choice(["all", *SCHEMES]), default="all",
              show_default=True,
              help="all: cr and spread on the tree, gc on its N workers with layer 1's s, "
                   "tree, rar.")
@click.option("--workers", "-N", type=click.IntRange(min=1), default=None,
              help="gc/rar: number of workers (default: the tree's worker count).")
@tree_options
@click.option("--samples", "-m", type=click.IntRange(min=1), default=60000, show_default=True,
              help="Samples in the global batch.")
@model_options
@click.option("--json", "as_json", is_flag=True, help="Print the predictions as one JSON object.")
def model_command(scheme, workers, fanout, layers, stragglers, samples, as_json, **inputs):
    """Predict the step time of each scheme with the run-time model (crnet.tune.model)."""
    from ..tune.model import predict

    stragglers = stragglers_in_effect(fanout, stragglers)
    names = ["cr", "spread", "gc", "tree", "rar"] if scheme == "all" else [scheme]
    # gc and rar given --workers need no tree (so --stragglers may exceed the default fanout).
    tree = None
    if (scheme != "gc" and scheme != "rar") or workers is None:
        tree = tree_from_options(fanout, resolve_layers(fanout, layers, stragglers), stragglers)
    if scheme == "all" and tree is not None and workers not in (None, tree.workers):
        raise click.UsageError(f"--scheme all compares every scheme on the tree's "
                               f"{tree.workers} workers: drop --workers {workers}")
    predictions = []
    for name in names:
        try:
            predictions.append(predict(name, tree=tree, workers=workers,
                                       stragglers=stragglers[0] if name == "gc" else 0,
                                       samples=samples, **inputs))
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    warn_if_absurd(predictions)
    if as_json:
        doc = inputs_json(samples, inputs)
        doc["schemes"] = {p.scheme: p.to_json() for p in predictions}
        click.echo(json.dumps(doc))
        return
    click.echo(f"model       {inputs_text(samples, inputs)}")
    click.echo()
    prediction_table(predictions)


ABSURD_STEP_S = 3600.0   # a predicted step over an hour is almost surely a unit mistaken


def warn_if_absurd(predictions) -> None:
    """A step predicted over an hour: say so, and how --compute's numbers are read (e.g.
    shifted-exp:1e-5,1 means a mean of 1 s per sample, not 1e-5 + 1 us)."""
    from ..units import format_seconds

    slow = [p for p in predictions if p.mean > ABSURD_STEP_S]
    if slow:
        worst = max(slow, key=lambda p: p.mean)
        click.echo(f"warning: {worst.scheme} ({worst.shape}) is predicted at "
                   f"{format_seconds(worst.mean)} per step (over an hour): check --compute "
                   "(A is time per sample, a plain number in seconds; shifted-exp's MU is a rate "
                   "per second, its mean 1/MU seconds per sample)", err=True)


def inputs_text(samples, inputs) -> str:
    from ..units import format_bytes, format_rate, format_seconds

    chunks = ("store and forward" if inputs["chunk_bytes"] is None
              else f"pipelined in {format_bytes(inputs['chunk_bytes'])} chunks")
    return (f"m = {samples} samples, {format_bytes(inputs['vector_bytes'])} vectors ({chunks}), "
            f"links {format_rate(inputs['bandwidth'])}, latency "
            f"{format_seconds(inputs['latency'])}, compute {inputs['compute'].describe()}, "
            f"{inputs['trials']} trials (seed {inputs['seed']})")


def inputs_json(samples, inputs) -> dict:
    return {"samples": samples, "vector_bytes": inputs["vector_bytes"],
            "bandwidth_bytes_per_s": inputs["bandwidth"], "latency_s": inputs["latency"],
            "compute": inputs["compute"].describe(), "chunk_bytes": inputs["chunk_bytes"],
            "trials": inputs["trials"], "seed": inputs["seed"]}


def prediction_table(predictions, numbered: bool = False, header: bool = True,
                      ranks=None) -> None:
    from ..units import format_seconds

    rows: list[tuple[str, ...]] = [
        (p.scheme, p.shape, str(p.max_load), format_seconds(p.mean), format_seconds(p.p50),
         format_seconds(p.p95)) for p in predictions]
    head: tuple[str, ...] = ("scheme", "shape", "load", "mean", "p50", "p95")
    if numbered or ranks:
        labels = [str(r) for r in (ranks or range(1, len(rows) + 1))]
        rows = [(label, *row) for label, row in zip(labels, rows)]
        head = ("rank", *head)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    right = {"load", "mean", "p50", "p95", "rank"}
    for row in ([head] if header else []) + rows:
        click.echo("  ".join(c.rjust(w) if h in right else c.ljust(w)
                             for c, w, h in zip(row, widths, head)).rstrip())

