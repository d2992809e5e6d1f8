"""Command line: ``crnet`` (plan, demo, ...) and ``crnetd`` (the daemon).

Only option parsing and printing lives here; the work is done by the modules it calls.
"""

from __future__ import annotations

import json
import sys

import click

from . import defaults
from .errors import CrnetError
from .plan import SCHEMES, Tree, scheme_tree
from .plan import plan as make_plan
from .run import DEFAULT_SAMPLES, Run
from .units import parse_bandwidth, parse_bytes, parse_seconds, plural


class IntList(click.ParamType):
    """An integer or a comma list of integers (one per tree layer): ``4`` or ``4,3``."""

    name = "INT[,INT...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            values = [int(v) for v in str(value).split(",")]
        except ValueError:
            self.fail(f"{value!r} is not an integer or a comma list of integers", param, ctx)
        return values


def tree_from_options(fanout, layers, stragglers) -> Tree:
    """The tree the options describe, or a usage error saying what is wrong."""
    try:
        return Tree.from_options(fanout, stragglers, layers)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def tree_options(f):
    """--fanout/--layers/--stragglers, shared by every command that builds a tree."""
    f = click.option("--stragglers", "-s", type=IntList(), default="1", show_default=True,
                     help="Stragglers tolerated per parent (one value, or one per layer).")(f)
    f = click.option("--layers", "-L", type=click.IntRange(min=1), default=None,
                     help="Tree depth (default: the length of the --fanout list, else 2).")(f)
    f = click.option("--fanout", "-n", type=IntList(), default="3", show_default=True,
                     help="Children per parent (one value, or one per layer).")(f)
    return f


def scheme_options(f):
    """--scheme and --workers (the host count for the star-shaped schemes gc and rar)."""
    f = click.option("--workers", "-N", type=click.IntRange(min=1), default=None,
                     help="gc/rar: number of workers (default: the tree's worker count).")(f)
    f = click.option("--scheme", type=click.Choice(SCHEMES), default="cr", show_default=True,
                     help="cr: CodedReduce tree; gc: gradient coding (star); rar: ring "
                          "allreduce; tree: CodedReduce without redundancy (s = 0).")(f)
    return f


def tree_for_scheme(scheme, workers, fanout, layers, stragglers) -> Tree:
    """The tree ``plan.scheme_tree`` gives for the options, or a usage error."""
    tree = None
    if scheme in ("cr", "tree") or workers is None:
        s = stragglers if scheme != "tree" else [0]
        tree = tree_from_options(fanout, resolve_layers(fanout, layers, stragglers), s)
    if scheme == "cr" and tree is not None and workers not in (None, tree.workers):
        raise click.UsageError(f"--workers {workers} but the cr tree has {tree.workers} workers")
    try:
        return scheme_tree(scheme, tree=tree, workers=workers, stragglers=stragglers[0])
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def resolve_layers(fanout, layers, stragglers):
    if layers is None:
        longest = max(len(fanout), len(stragglers))
        layers = longest if longest > 1 else 2
    return layers


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="crnet")
def main():
    """crnet: straggler-tolerant gradient aggregation (CodedReduce)."""


class UnitValue(click.ParamType):
    """A number with a unit, read by one of ``crnet.units``' parsers (50us, 1Gbit, 4MB)."""

    def __init__(self, name: str, parse):
        self.name, self._parse = name, parse

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return self._parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class ChunkSize(click.ParamType):
    """``auto`` (a chunk size that grows with the vector) or a size in bytes (4MiB, 1048576)."""

    name = "auto|SIZE"

    def convert(self, value, param, ctx):
        if value == defaults.CHUNK_AUTO or (isinstance(value, str) and value.strip().lower() == "auto"):
            return defaults.CHUNK_AUTO
        try:
            size = int(value) if isinstance(value, int) else int(parse_bytes(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if size < 1024:
            self.fail(f"{value!r} is below 1 KiB (or say auto)", param, ctx)
        return size


class ComputeSpec(click.ParamType):
    """A ``crnet.workload.ComputeModel`` spelling: straggle:1e-4,0.1,10 and the like."""

    name = "KIND:ARGS"

    def convert(self, value, param, ctx):
        from .workload import ComputeModel

        if isinstance(value, ComputeModel):
            return value
        try:
            return ComputeModel.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def model_options(f):
    """The run-time model's inputs (``crnet.model``): ``crnet model`` and ``crnet plan --auto``."""
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
                     help="A worker's compute time per step, A = seconds per sample: fixed:A, "
                          "straggle:A,P,F (slowed F times with probability P), shifted-exp:A,MU, "
                          "empirical:A,FILE (FILE: multipliers or measured step times, one per "
                          "line, divided by their minimum)."),
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


@main.command(short_help="Show who computes which samples, or rank tree shapes (--auto).")
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

    With --auto, rank schemes (cr, gc, tree, rar) and tree shapes for --hosts workers by the
    run-time model's predicted mean step time instead (the --vector-bytes ... options).
    """
    if auto or hosts is not None:
        _plan_auto(ctx, auto, hosts, samples, top, max_layers, as_json, inputs)
        return
    given = _given(ctx, MODEL_OPTIONS + ("top", "max_layers"))
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
    click.echo(f"tree        fanout {_csv(tree.fanout)}, stragglers {_csv(tree.stragglers)}, "
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


def _csv(values) -> str:
    return ",".join(str(v) for v in values)


def _ranges(ranges, limit: int = 4) -> str:
    if not ranges:
        return "-"
    shown = [f"{a}:{b}" + ("" if w == 1.0 else f"x{w:.4g}") for a, b, w in ranges[:limit]]
    if len(ranges) > limit:
        shown.append(f"... (+{len(ranges) - limit})")
    return " ".join(shown)


@main.command(short_help="Train logistic regression on a local tree, with stragglers.")
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
@click.option("--json", "as_json", is_flag=True, help="End with the summary as one JSON line.")
def demo(scheme, workers, fanout, layers, stragglers, steps, samples, features, straggle_prob,
         straggle_factor, compute_ms, timeout, seed, as_json):
    """Train logistic regression on a local tree of real crnetd processes, with stragglers."""
    from .demo import DemoConfig, run_demo

    tree = tree_for_scheme(scheme, workers, fanout, layers, stragglers)
    cfg = DemoConfig(fanout=tree.fanout, stragglers=tree.stragglers, scheme=scheme, steps=steps,
                     samples=samples,
                     features=features, straggle_prob=straggle_prob,
                     straggle_factor=straggle_factor, compute_ms=compute_ms, timeout=timeout,
                     seed=seed)
    click.echo(f"crnet demo ({scheme}): {plural(tree.workers, 'worker')} + master (fanout "
               f"{_csv(tree.fanout)}, stragglers {_csv(tree.stragglers)}), "
               f"{plural(steps, 'step')} of full-batch gradient descent on "
               f"{plural(samples, 'sample')} x {plural(features, 'feature')}", err=True)
    try:
        summary = run_demo(cfg)
    except (CrnetError, OSError) as e:
        raise click.ClickException(str(e)) from None
    ok = summary["max_rel_error"] <= 1e-6
    click.echo(f"steps               {summary['steps']}")
    click.echo(f"mean step time      {1e3 * summary['mean_step_s']:.1f} ms")
    click.echo(f"stragglers injected {summary['stragglers_injected']}")
    click.echo(f"stragglers skipped  {summary['stragglers_skipped']} (children a parent decoded without)")
    click.echo(f"final loss          {summary['final_loss']:.6f}")
    click.echo(f"max rel. difference {summary['max_rel_error']:.2e} vs single-process gradient "
               f"descent ({'exact' if ok else 'TOO LARGE'})")
    if as_json:
        keys = ("steps", "mean_step_s", "max_rel_error", "stragglers_skipped",
                "stragglers_injected", "final_loss")
        click.echo(json.dumps({k: summary[k] for k in keys}))
    if not ok:
        raise SystemExit(1)


@main.command("run", context_settings={"allow_interspersed_args": False},
              short_help="Start a local tree and a training process per host.")
@scheme_options
@tree_options
@click.option("--local-processes", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Training processes per host; the host's share of each batch is cut among them.")
@click.option("--samples", "-m", type=click.IntRange(min=1), default=DEFAULT_SAMPLES,
              show_default=True,
              help="Samples in the global batch of a step (the script reads c.assignment.samples).")
@click.option("--timeout", type=click.FloatRange(min=0.01), default=defaults.TIMEOUT,
              show_default=True, help="The daemons' --timeout: seconds a step may wait for its quorum.")
@click.option("--job", default=None,
              help="The job name every training process gets as CRNET_JOB (default: a new one).")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Daemon sockets and logs (logs/<host>.log) go here, and stay "
                   "(default: a temporary directory, removed unless the run fails).")
@click.option("--keep-logs", is_flag=True, help="Keep the temporary directory and its logs.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(scheme, workers, fanout, layers, stragglers, local_processes, samples, timeout, job,
        workdir, keep_logs, command):
    """Start a local tree and one training process per host (K with --local-processes).

    \b
    crnet run --fanout 3 --layers 2 --stragglers 1 -- python train.py --lr 0.1

    Each process finds in its environment CRNET_CLIENT_SOCKET (so crnet.Client() needs no
    argument), CRNET_JOB, CRNET_HOST (its host's tree name; "" on the master),
    CRNET_LOCAL_PROCESS (0..K-1), CRNET_RANK (0..P-1, the master's host first) and
    CRNET_WORLD_SIZE (P). Every output line is prefixed with its host ([master], [0.1],
    [0.1/1] when K > 1). SIGINT, SIGTERM and SIGHUP are forwarded to the processes. When one
    fails, the others get 5 s, then SIGTERM. Exits with the first non-zero exit
    code of a process (killed by signal N: 128+N), else 0; every process is stopped.
    """
    tree = tree_for_scheme(scheme, workers, fanout, layers, stragglers)
    launcher = Run(tree, command, samples=samples, local_processes=local_processes, scheme=scheme,
                   timeout=timeout, job=job, workdir=workdir, keep_logs=keep_logs,
                   stdout=sys.stdout.buffer, stderr=sys.stderr.buffer)
    try:
        code = launcher.run()
    except (CrnetError, OSError) as e:
        raise click.ClickException(str(e)) from None
    raise SystemExit(code)


@main.command(short_help="Compare every scheme and Gloo on an emulated cluster (root).")
@click.option("--preset", "presets", multiple=True, default=["stragglers"], show_default=True,
              type=click.Choice(["stragglers", "heavy-tail", "dead", "bandwidth", "quick"]),
              help="Scenario (repeatable).")
@click.option("--schemes", default="cr,gc,tree,rar,gloo", show_default=True,
              help="Comma list of cr, gc, tree, rar and gloo (PyTorch's ring allreduce).")
@click.option("--sweep", is_flag=True,
              help="Also sweep straggle probability x slowdown (stragglers preset; cr, rar, gloo).")
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
def bench(presets, schemes, sweep, persistent_stragglers, steps, burst, seed, out, plot_path,
          workdir, as_json):
    """Every scheme and PyTorch's Gloo on an emulated cluster (root: network namespaces).

    Runs from a source checkout (the benchmarks/ package next to crnet/), installed with
    pip install -e '.[bench]'.
    """
    import dataclasses
    import sys
    import tempfile
    from pathlib import Path

    # The benchmarks are not in the wheel: they live next to crnet/ in the source checkout.
    try:
        import benchmarks  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "benchmarks":
            raise
        checkout = Path(__file__).resolve().parent.parent
        if not (checkout / "benchmarks" / "__init__.py").is_file():
            raise click.UsageError(
                "crnet bench runs from a source checkout (its benchmarks/ package is not part "
                "of the installed crnet): clone the crnet repository and run "
                "pip install -e '.[bench]' in it") from None
        sys.path.append(str(checkout))
    from benchmarks import report
    from benchmarks.netns import requirements
    from benchmarks.presets import PRESETS
    from benchmarks.runner import run_preset, run_sweep

    chosen = [s.strip() for s in schemes.split(",") if s.strip()]
    unknown = set(chosen) - {"cr", "gc", "tree", "rar", "gloo"}
    if unknown or "cr" not in chosen:
        raise click.UsageError(f"--schemes must include cr and only cr, gc, tree, rar, gloo "
                               f"(got {schemes!r})")
    problem = requirements()
    if problem:
        raise click.ClickException(f"crnet bench emulates hosts with network namespaces: {problem}")
    if "gloo" in chosen:
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            click.echo("note: torch is not installed, skipping gloo (pip install torch==2.13.0)",
                       err=True)
            chosen.remove("gloo")
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="crnet-bench-")
        workdir = tmp.name
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
                                   log=lambda m: click.echo(m, err=True)))
            Path(out).write_text(json.dumps({"presets": docs, "sweep": None}, indent=1))
        points = None
        if sweep:
            sweep_schemes = [s for s in ("cr", "rar", "gloo") if s in chosen]
            points = run_sweep(PRESETS["stragglers"], sweep_schemes, Path(workdir) / "sweep", seed,
                               log=lambda m: click.echo(m, err=True))
    finally:
        if tmp is not None:
            tmp.cleanup()
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


class Address(click.ParamType):
    """HOST:PORT (IPv6 as [::1]:PORT); ports from ``min_port`` (0: any free port)."""

    name = "HOST:PORT"

    def __init__(self, min_port: int = 0):
        self.min_port = min_port

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        if not sep or not port.isdigit():
            self.fail(f"{value!r} is not HOST:PORT", param, ctx)
        if not self.min_port <= int(port) <= 65535:
            self.fail(f"port {port} is out of range {self.min_port}..65535", param, ctx)
        return (host.strip("[]") or "0.0.0.0", int(port))


class MetricsAddress(Address):
    """PORT or HOST:PORT: on 127.0.0.1 unless a host is given."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.isdigit():
            value = f"127.0.0.1:{value}"
        elif isinstance(value, str) and value.startswith(":"):
            value = "127.0.0.1" + value
        return super().convert(value, param, ctx)


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                 "auto_envvar_prefix": "CRNET"})
@click.option("--role", type=click.Choice(["master", "node"]), required=True,
              help="master: the tree's root; node: every other host.")
@click.option("--listen", type=Address(), default=None,
              help="Where children connect (master, and nodes that have children).")
@click.option("--parent", type=Address(min_port=1), default=None,
              help="The parent's --listen (nodes).")
@click.option("--resolve-timeout", type=click.FloatRange(min=0), default=defaults.RESOLVE_TIMEOUT,
              show_default=True,
              help="Node: seconds the parent's host name may fail to resolve before the node "
                   "gives up (exit 2).")
@click.option("--name", default=None,
              help="Node: the tree slot to (re)claim, e.g. 0.2; default: any free slot.")
@scheme_options
@tree_options
@click.option("--samples", "-m", type=click.IntRange(min=1), default=None,
              help="Master: samples in the global batch.")
@click.option("--code", "code_kind", type=click.Choice(["auto", "frc", "crc"]), default="auto",
              show_default=True, envvar="CRNET_CODE", help="Master: gradient code at every parent.")
@click.option("--client-socket", type=click.Path(dir_okay=False), default=defaults.CLIENT_SOCKET,
              show_default=True,
              help="Unix socket for the local training processes (mode 600: this user's; "
                   "its directory is created if missing).")
@click.option("--client-group", default=None,
              help="Also let this group's members' training processes connect (mode 660).")
@click.option("--chunk-bytes", type=ChunkSize(), default="auto", show_default=True,
              help="Pipelining unit (master; the tree uses the master's): a size, or auto: "
                   "1 MiB up to 16 MiB vectors, then 1/16 of the vector, at most 4 MiB.")
@click.option("--timeout", type=click.FloatRange(min=0.01), default=defaults.TIMEOUT,
              show_default=True,
              help="Seconds a step may wait for its quorum at a node before it fails there.")
@click.option("--keep-results", type=click.IntRange(min=1), default=defaults.KEEP_RESULTS,
              show_default=True,
              help="Finished steps' results kept for children that missed them.")
@click.option("--local-processes", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Training processes on this host (one per accelerator, say): the host's "
                   "share is cut among them and their vectors are summed here.")
@click.option("--result-memory", type=UnitValue("SIZE", parse_bytes), default="1GiB",
              show_default=True,
              help="Results kept for this host's training processes until they take them "
                   "(they catch up on every step they missed, up to this much).")
@click.option("--step-window", type=click.IntRange(min=1), default=defaults.STEP_WINDOW,
              show_default=True,
              help="Steps further than this ahead of the tree's newest result are refused "
                   "(StepRefused) to whoever asks for them.")
@click.option("--max-send-queue", type=UnitValue("SIZE", parse_bytes), default=None,
              help="Cut off a child that stopped reading once this much is queued for it "
                   "(default: the larger of 64MiB and 4 vectors).")
@click.option("--secret-file", type=click.Path(dir_okay=False), default=None,
              help="The cluster secret (the same file on every host, mode 600): every tree "
                   "link is mutually authenticated with it (HMAC-SHA256 challenge-response).")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Mutual TLS on every tree link: this host's certificate (PEM; with "
                   "--tls-key and --tls-ca).")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None,
              help="This host's private key (PEM).")
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The cluster CA that signed every host's certificate (PEM).")
@click.option("--insecure", is_flag=True,
              help="Listen on a non-loopback address without --secret-file: any host that "
                   "reaches the port can join the tree.")
@click.option("--metrics", type=MetricsAddress(), default=None,
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (PORT alone: on "
                   "127.0.0.1). Beyond loopback it needs --metrics-token-file (or --insecure).")
@click.option("--metrics-token-file", type=click.Path(dir_okay=False), default=None,
              help="The bearer token scrapers must send (mode 600; Prometheus' "
                   "authorization: {credentials_file: ...}).")
@click.option("--host-id", default=None,
              help="Node: this host's stable identity, sent to the parent, which gives it "
                   "the same slot whenever it comes back (default: the hostname; --name wins).")
@click.option("--strict", is_flag=True,
              help="Exit with code 70 on any internal error instead of dropping the "
                   "connection it happened on (the tests run this way).")
@click.option("--exit-with-stdin", is_flag=True,
              help="Stop, as on SIGTERM, when standard input (a pipe) closes: a launcher "
                   "holding the pipe's other end takes its daemons with it when it dies.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True, help="Re-read from the config file on SIGHUP.")
@click.option("--log-format", type=click.Choice(["kv", "json"]), default="kv", show_default=True,
              help="One event per line: key=value pairs, or a JSON object.")
@click.option("--config", type=click.Path(dir_okay=False), default=None, is_eager=True,
              expose_value=False, callback=lambda ctx, param, value: _read_config(ctx, value),
              help="A TOML file of options (keys: the long option names with _, e.g. "
                   "client_socket); flags and CRNET_* variables win over it.")
@click.option("--check-config", is_flag=True, allow_from_autoenv=False,
              help="Print the effective configuration (each value and where it came from) "
                   "and exit: 0 if it is good, 2 naming what is wrong.")
@click.pass_context
def crnetd(ctx, check_config, log_level, log_format, **options):
    """The crnet daemon: one host of the CodedReduce tree.

    \b
    crnetd --role master --listen 0.0.0.0:7070 --fanout 3 --layers 2 --stragglers 1 --samples 60000
    crnetd --role node --parent master-host:7070 --listen 0.0.0.0:7071

    Every option can also be set as CRNET_<OPTION>, e.g. CRNET_CLIENT_SOCKET, or in the
    --config file; a flag wins over CRNET_*, which wins over the file (docs/operations.md).
    """
    from .config import effective_config
    from .logs import setup_logging
    from .node import run_node

    config = effective_config(ctx)
    if check_config:
        click.echo(config.describe())
        return
    setup_logging(log_level, log_format)
    try:
        code = run_node(config.settings)
    except OSError as e:
        raise click.ClickException(f"cannot start: {e}") from None
    raise SystemExit(code)


def _read_config(ctx, path):
    from .config import read_config

    read_config(ctx, path)


main.add_command(crnetd, name="daemon")


@main.command("status", short_help="Show the tree under a node: who is joined, slow or missing.")
@click.argument("address", type=Address())
@click.option("--secret-file", type=click.Path(dir_okay=False), default=None,
              envvar="CRNET_SECRET_FILE", help="The cluster secret, as crnetd's.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
              envvar="CRNET_TLS_CERT", help="As crnetd's, if the tree uses TLS.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None,
              envvar="CRNET_TLS_KEY")
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None,
              envvar="CRNET_TLS_CA")
@click.option("--json", "as_json", is_flag=True, help="Print the tree as one JSON object.")
@click.option("--watch", type=click.FloatRange(min=0.5), is_flag=False, flag_value=2.0,
              default=None, help="Refresh every SECONDS (2 if not given) until Ctrl-C.")
def status_command(address, secret_file, tls_cert, tls_key, tls_ca, as_json, watch):
    """Show the tree under a node (ask the master for all of it): every node's name, host,
    address, state, last step time and how often it straggled, and who is missing.

    \b
    crnet status master-host:7070 --secret-file /etc/crnet/secret
    """
    from .auth import load_secret
    from .status import StatusClient
    from .tls import TlsFiles

    secret = None
    if secret_file is not None:
        try:
            secret = load_secret(secret_file)
        except (OSError, ValueError) as e:
            raise click.BadParameter(str(e), param_hint="--secret-file") from None
    given = [v for v in (tls_cert, tls_key, tls_ca) if v is not None]
    if given and len(given) < 3:
        raise click.UsageError("--tls-cert, --tls-key and --tls-ca come together")
    tls = TlsFiles(tls_cert, tls_key, tls_ca) if given else None

    async def ask() -> None:
        client = await StatusClient.connect(address[0], address[1], secret=secret, tls=tls)
        try:
            tree = client.first
            while True:
                assert tree is not None
                click.echo(json.dumps(tree) if as_json else _status_text(tree))
                if watch is None:
                    return
                await asyncio.sleep(watch)
                tree = await client.refresh()
        finally:
            client.close()

    import asyncio

    try:
        asyncio.run(ask())
    except KeyboardInterrupt:
        pass
    except (OSError, CrnetError, asyncio.TimeoutError) as e:
        raise click.ClickException(f"{address[0]}:{address[1]}: {e or 'no answer'}") from None


def _status_text(tree: dict) -> str:
    from .status import missing, rows

    lines = [f"{'NODE':<14} {'HOST':<20} {'ADDRESS':<22} {'STATE':<13} {'STEP':>7} "
             f"{'LAST STEP':>10} {'STRAGGLED':>10}"]
    for r in rows(tree):
        last = "-" if r.last_step_seconds is None else f"{1e3 * r.last_step_seconds:.1f} ms"
        straggled = "-" if r.recent is None else f"{r.straggled}/{r.recent}"
        lines.append(f"{'  ' * r.depth + r.name:<14} {r.host or '-':<20} {r.address or '-':<22} "
                     f"{r.state:<13} {r.tree_step:>7} {last:>10} {straggled:>10}")
    gone = missing(tree)
    lines.append("missing now: " + (", ".join(f"{r.name} ({r.host or 'host unknown'})"
                                              for r in gone) if gone else "none"))
    return "\n".join(lines)


# ---- run-time model: crnet model, crnet plan --auto --------------------------------------


@main.command("model", short_help="Predict each scheme's step time (the run-time model).")
@click.option("--scheme", type=click.Choice(["all", *SCHEMES]), default="all",
              show_default=True,
              help="all: cr on the tree, gc on its N workers with layer 1's s, tree, rar.")
@click.option("--workers", "-N", type=click.IntRange(min=1), default=None,
              help="gc/rar: number of workers (default: the tree's worker count).")
@tree_options
@click.option("--samples", "-m", type=click.IntRange(min=1), default=60000, show_default=True,
              help="Samples in the global batch.")
@model_options
@click.option("--json", "as_json", is_flag=True, help="Print the predictions as one JSON object.")
def model_command(scheme, workers, fanout, layers, stragglers, samples, as_json, **inputs):
    """Predict the step time of each scheme with the run-time model (crnet.model)."""
    from .model import predict

    names = ["cr", "gc", "tree", "rar"] if scheme == "all" else [scheme]
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
    if as_json:
        doc = _model_inputs_json(samples, inputs)
        doc["schemes"] = {p.scheme: p.to_json() for p in predictions}
        click.echo(json.dumps(doc))
        return
    click.echo(f"model       {_model_inputs_text(samples, inputs)}")
    click.echo()
    _prediction_table(predictions)


def _plan_auto(ctx, auto, hosts, samples, top, max_layers, as_json, inputs) -> None:
    """``crnet plan --auto``: the best schemes and shapes for ``hosts`` workers."""
    from .model import Prediction, candidates, rank

    if not auto:
        raise click.UsageError("--hosts is for --auto")
    if hosts is None:
        raise click.UsageError("--auto needs --hosts N (the number of workers)")
    given = _given(ctx, ("fanout", "layers", "stragglers", "code_kind"))
    if given:
        raise click.UsageError(f"--auto searches the tree shapes itself: drop {given[0]}")
    samples = 60000 if samples is None else samples
    try:
        ranked = rank(hosts, samples=samples, max_layers=max_layers, top=None, **inputs)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    count = len(candidates(hosts, max_layers))
    best_of: dict[str, Prediction] = {}
    for p in ranked:
        best_of.setdefault(p.scheme, p)
    if as_json:
        doc = {"hosts": hosts, **_model_inputs_json(samples, inputs), "candidates": count,
               "ranking": [p.to_json() for p in ranked[:top]],
               "best_per_scheme": {name: p.to_json() for name, p in best_of.items()}}
        click.echo(json.dumps(doc))
        return
    click.echo(f"hosts       {plural(hosts, 'worker')} (+ the master): {count} schemes and "
               "shapes tried")
    click.echo(f"model       {_model_inputs_text(samples, inputs)}")
    click.echo()
    _prediction_table(ranked[:top], numbered=True)
    others = [p for p in best_of.values() if p not in ranked[:top]]
    if others:
        click.echo()
        click.echo("best of the other schemes:")
        _prediction_table(others, numbered=False, header=False,
                          ranks=[ranked.index(p) + 1 for p in others])


def _given(ctx, names) -> list[str]:
    """The options among ``names`` that were typed on the command line, as --spellings."""
    from click.core import ParameterSource

    params = {p.name: p for p in ctx.command.params}
    return [params[n].opts[0] for n in names
            if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]


def _model_inputs_text(samples, inputs) -> str:
    from .units import format_bytes, format_rate, format_seconds

    chunks = ("store and forward" if inputs["chunk_bytes"] is None
              else f"pipelined in {format_bytes(inputs['chunk_bytes'])} chunks")
    return (f"m = {samples} samples, {format_bytes(inputs['vector_bytes'])} vectors ({chunks}), "
            f"links {format_rate(inputs['bandwidth'])}, latency "
            f"{format_seconds(inputs['latency'])}, compute {inputs['compute'].describe()}, "
            f"{inputs['trials']} trials (seed {inputs['seed']})")


def _model_inputs_json(samples, inputs) -> dict:
    return {"samples": samples, "vector_bytes": inputs["vector_bytes"],
            "bandwidth_bytes_per_s": inputs["bandwidth"], "latency_s": inputs["latency"],
            "compute": inputs["compute"].describe(), "chunk_bytes": inputs["chunk_bytes"],
            "trials": inputs["trials"], "seed": inputs["seed"]}


def _prediction_table(predictions, numbered: bool = False, header: bool = True,
                      ranks=None) -> None:
    from .units import format_seconds

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
