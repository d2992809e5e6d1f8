"""Command line: ``crnet`` (plan, demo, ...) and ``crnetd`` (the daemon).

Only option parsing and printing lives here; the work is done by the modules it calls.
"""

from __future__ import annotations

import json

import click

from .plan import Tree, plan as make_plan


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


SCHEMES = ("cr", "gc", "rar", "tree")


def scheme_options(f):
    """--scheme and --workers (the host count for the star-shaped schemes gc and rar)."""
    f = click.option("--workers", "-N", type=click.IntRange(min=1), default=None,
                     help="gc/rar: number of workers (default: the tree's worker count).")(f)
    f = click.option("--scheme", type=click.Choice(SCHEMES), default="cr", show_default=True,
                     help="cr: CodedReduce tree; gc: gradient coding (star); rar: ring "
                          "allreduce; tree: CodedReduce without redundancy (s = 0).")(f)
    return f


def scheme_tree(scheme, workers, fanout, layers, stragglers) -> Tree:
    """The join/allocation tree of a scheme.

    gc is CodedReduce on a one-layer tree (the master decodes any N-s of N), tree is
    CodedReduce with s = 0, and rar joins as a star (the master only coordinates;
    the data moves around the ring of workers).
    """
    tree = tree_from_options(fanout, resolve_layers(fanout, layers, stragglers), stragglers)
    n = workers or tree.workers
    try:
        if scheme == "gc":
            return Tree((n,), (stragglers[0],))
        if scheme == "rar":
            return Tree((n,), (0,))
        if scheme == "tree":
            return Tree(tree.fanout, (0,) * tree.layers)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if workers is not None and workers != tree.workers:
        raise click.UsageError(f"--workers {workers} but the cr tree has {tree.workers} workers")
    return tree


def resolve_layers(fanout, layers, stragglers):
    if layers is None:
        longest = max(len(fanout), len(stragglers))
        layers = longest if longest > 1 else 2
    return layers


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="crnet")
def main():
    """crnet: straggler-tolerant gradient aggregation (CodedReduce)."""


@main.command()
@tree_options
@click.option("--samples", "-m", type=click.IntRange(min=1), required=True,
              help="Samples in the global batch.")
@click.option("--code", "code_kind", type=click.Choice(["auto", "frc", "crc"]), default="auto",
              show_default=True, help="Gradient code at every parent.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(fanout, layers, stragglers, samples, code_kind, as_json):
    """Show the CodedReduce allocation: who computes which samples."""
    tree = tree_from_options(fanout, resolve_layers(fanout, layers, stragglers), stragglers)
    try:
        p = make_plan(tree, samples, code_kind)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if as_json:
        click.echo(json.dumps(p.to_json()))
        return
    click.echo(f"tree        fanout {_csv(tree.fanout)}, stragglers {_csv(tree.stragglers)}, "
               f"{tree.layers} layers")
    click.echo(f"workers     N = {tree.workers} (+ the master)")
    click.echo(f"load        d* = {p.optimal_load:.6g} of the batch "
               f"({p.optimal_load * samples:.1f} of {samples} samples); "
               f"max local {p.max_local_samples} (uncoded: {samples / tree.workers:.1f})")
    for l, (n, s) in enumerate(zip(tree.fanout, tree.stragglers), start=1):
        click.echo(f"resiliency  layer {l}: any {s} of the {n} children of every parent may "
                   f"straggle ({_code_name(tree, l, code_kind)} code)")
    click.echo(f"master      receives {tree.fanout[0]} vectors per step (gradient coding: {tree.workers})")
    click.echo()
    rows = [(a.name or "(master)", str(a.layer), str(a.local_samples), _ranges(a.local),
             _ranges(a.responsibility)) for a in p.nodes.values()]
    header = ("node", "layer", "local", "local ranges", "responsibility")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])


def _code_name(tree: Tree, layer: int, code_kind: str) -> str:
    first_parent_of_layer = ".".join(["0"] * (layer - 1))
    return tree.code_of(first_parent_of_layer, code_kind).kind


def _csv(values) -> str:
    return ",".join(str(v) for v in values)


def _ranges(ranges, limit: int = 4) -> str:
    if not ranges:
        return "-"
    shown = [f"{a}:{b}" + ("" if w == 1.0 else f"x{w:.4g}") for a, b, w in ranges[:limit]]
    if len(ranges) > limit:
        shown.append(f"... (+{len(ranges) - limit})")
    return " ".join(shown)


@main.command()
@scheme_options
@tree_options
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--samples", "-m", type=click.IntRange(min=1), default=6000, show_default=True,
              help="Samples in the (full) batch.")
@click.option("--features", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--straggle-prob", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="Chance that a worker straggles in a step.")
@click.option("--straggle-factor", type=click.FloatRange(min=1), default=5.0, show_default=True,
              help="A straggling worker takes this many times its compute time.")
@click.option("--compute-ms", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="Emulated minimum compute time of a worker's step.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="End with the summary as one JSON line.")
def demo(scheme, workers, fanout, layers, stragglers, steps, samples, features, straggle_prob, straggle_factor,
         compute_ms, timeout, seed, as_json):
    """Train logistic regression on a local tree of real crnetd processes, with stragglers."""
    from .demo import DemoConfig, run_demo

    tree = scheme_tree(scheme, workers, fanout, layers, stragglers)
    cfg = DemoConfig(fanout=tree.fanout, stragglers=tree.stragglers, scheme=scheme, steps=steps,
                     samples=samples,
                     features=features, straggle_prob=straggle_prob,
                     straggle_factor=straggle_factor, compute_ms=compute_ms, timeout=timeout,
                     seed=seed)
    click.echo(f"crnet demo ({scheme}): {tree.workers} workers + master (fanout {_csv(tree.fanout)}, "
               f"stragglers {_csv(tree.stragglers)}), {steps} steps of full-batch gradient "
               f"descent on {samples} samples x {features} features", err=True)
    try:
        summary = run_demo(cfg)
    except (RuntimeError, TimeoutError, OSError) as e:
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
        keys = ("steps", "mean_step_s", "max_rel_error", "stragglers_skipped")
        click.echo(json.dumps({k: summary[k] for k in keys}))
    if not ok:
        raise SystemExit(1)


class Address(click.ParamType):
    """HOST:PORT (IPv6 as [::1]:PORT)."""

    name = "HOST:PORT"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
            self.fail(f"{value!r} is not HOST:PORT", param, ctx)
        return (host.strip("[]") or "0.0.0.0", int(port))


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                 "auto_envvar_prefix": "CRNET"})
@click.option("--role", type=click.Choice(["master", "node"]), required=True,
              help="master: the tree's root; node: every other host.")
@click.option("--listen", type=Address(), default=None,
              help="Where children connect (master, and nodes that have children).")
@click.option("--parent", type=Address(), default=None, help="The parent's --listen (nodes).")
@click.option("--name", default=None,
              help="Node: the tree slot to (re)claim, e.g. 0.2; default: any free slot.")
@scheme_options
@tree_options
@click.option("--samples", "-m", type=click.IntRange(min=1), default=None,
              help="Master: samples in the global batch.")
@click.option("--code", "code_kind", type=click.Choice(["auto", "frc", "crc"]), default="auto",
              show_default=True, help="Master: gradient code at every parent.")
@click.option("--client-socket", type=click.Path(dir_okay=False), default=None,
              help="Unix socket for the local training process.")
@click.option("--chunk-bytes", type=click.IntRange(min=1024), default=1 << 20, show_default=True,
              help="Pipelining unit (master; the tree uses the master's).")
@click.option("--timeout", type=click.FloatRange(min=0.01), default=30.0, show_default=True,
              help="Seconds a step may wait for its quorum at a node before it fails there.")
@click.option("--keep-results", type=click.IntRange(min=1), default=4, show_default=True,
              help="Finished steps' results kept for training processes that fell behind.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
def crnetd(role, listen, parent, name, scheme, workers, fanout, layers, stragglers, samples,
           code_kind, client_socket, chunk_bytes, timeout, keep_results, log_level):
    """The crnet daemon: one host of the CodedReduce tree.

    \b
    crnetd --role master --listen 0.0.0.0:7070 --fanout 3 --layers 2 --stragglers 1 --samples 60000
    crnetd --role node --parent master-host:7070 --listen 0.0.0.0:7071

    Every option can also be set as CRNET_<OPTION>, e.g. CRNET_CLIENT_SOCKET.
    """
    import logging

    from .daemon import Settings, run_daemon

    if role == "master":
        if listen is None or samples is None:
            raise click.UsageError("--role master needs --listen and --samples")
        if parent is not None or name is not None:
            raise click.UsageError("--parent and --name are for --role node")
        tree = scheme_tree(scheme, workers, fanout, layers, stragglers)
    else:
        if parent is None:
            raise click.UsageError("--role node needs --parent HOST:PORT")
        tree = None
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)-7s %(name)s[%(process)d]: %(message)s")
    settings = Settings(role=role, scheme=scheme, listen=listen, parent=parent, name=name, tree=tree,
                        samples=samples, code_kind=code_kind, chunk_bytes=chunk_bytes,
                        client_socket=client_socket, timeout=timeout, keep_results=keep_results)
    try:
        code = run_daemon(settings)
    except OSError as e:
        raise click.ClickException(f"cannot start: {e}") from None
    raise SystemExit(code)


main.add_command(crnetd, name="daemon")
