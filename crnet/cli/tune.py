"""``crnet tune``: what the running tree measured (or, ``--probe``, a short probe of an idle
tree), and every scheme and shape ranked by the model fitted to it (``crnet.tune.gather``
asks the tree, ``crnet.tune.tuning`` and ``crnet.tune.probe`` do the work; this parses and
prints)."""

from __future__ import annotations

import json

import click

from ..config.types import Address, UnitValue
from ..defaults import PROBE_BYTES_MAX, PROBE_BYTES_MIN
from ..errors import CrnetError
from ..peer_text import tamed
from ..units import format_bytes, parse_bandwidth, parse_bytes, parse_seconds
from .model import prediction_table
from .shared import credential_options, credentials


@click.command("tune", short_help="Fit the model to what the tree measured; rank every shape.")
@click.argument("address", type=Address())
@credential_options
@click.option("--json", "as_json", is_flag=True, help="Print the fit and the ranking as JSON.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many of the best to print.")
@click.option("--max-layers", type=click.IntRange(1, 6), default=3, show_default=True,
              help="Deepest tree tried.")
@click.option("--trials", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Simulated steps per scheme and shape.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the simulated compute times.")
@click.option("--bandwidth", type=UnitValue("RATE", parse_bandwidth), default=None,
              help="Use this link rate instead of the measured one (1Gbit, 12.5MB).")
@click.option("--latency", type=UnitValue("TIME", parse_seconds), default=None,
              help="Use this one-way latency instead of the measured one (50us).")
@click.option("--write", "write", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the best choice as the master's configuration to this file "
                   "(crnetd --config: scheme, shape, stragglers, batch, chunk size).")
@click.option("--probe", is_flag=True,
              help="Measure an idle tree first (no job's process attached): the master has every "
                   "node time its links to its children and a compute kernel, and the ranking is "
                   "from those (for a tree that has not trained yet).")
@click.option("--probe-bytes", type=UnitValue("SIZE", parse_bytes), default=None,
              help=f"With --probe: bytes each node sends each child per round (default: the "
                   f"tree's vector size if a step ran, else 4 MiB; {format_bytes(PROBE_BYTES_MIN)}"
                   f" to {format_bytes(PROBE_BYTES_MAX)}).")
@click.option("--per-sample", type=UnitValue("TIME", parse_seconds), default=None,
              help="With --probe: one sample's compute on the fastest host (e.g. one local step "
                   "of your model over its batch); the probe gives each host's speed relative to "
                   "it. Default: the probe kernel's own time stands in.")
def tune_command(address, secret_file, tls_cert, tls_key, tls_ca, as_json, top, max_layers,
                 trials, seed, bandwidth, latency, write, probe, probe_bytes, per_sample):
    """Gather what every node under ADDRESS measured while training (ask the master for the
    whole tree): each host's compute time per step, its links' throughput and round-trip
    time; fit the run-time model's compute law and links to it, and rank every scheme and
    tree shape for this many workers as plan --auto does; the running configuration is
    shown first, its prediction next to its measured step time.

    \b
    crnet tune master-host:7070 --secret-file /etc/crnet/secret
    crnet tune master-host:7070 --secret-file /etc/crnet/secret --write tuned.toml
    crnet tune master-host:7070 --secret-file /etc/crnet/secret --probe --per-sample 2ms
    """
    import asyncio

    from ..tune.gather import gather, gather_probe
    from ..tune.probe import probed_measurements
    from ..tune.tuning import config_text, measurements, tune

    if not probe and (probe_bytes is not None or per_sample is not None):
        raise click.UsageError("--probe-bytes and --per-sample go with --probe")
    if probe_bytes is not None and not PROBE_BYTES_MIN <= probe_bytes <= PROBE_BYTES_MAX:
        raise click.BadParameter(f"{format_bytes(probe_bytes)} is not within "
                                 f"{format_bytes(PROBE_BYTES_MIN)} .. {format_bytes(PROBE_BYTES_MAX)}",
                                 param_hint="--probe-bytes")
    secret, tls = credentials(secret_file, tls_cert, tls_key, tls_ca)
    where = f"{address[0]}:{address[1]}"
    try:
        if probe:
            tree = asyncio.run(gather_probe(address[0], address[1], secret=secret, tls=tls,
                                            probe_bytes=None if probe_bytes is None else int(probe_bytes)))
            measured = probed_measurements(tree, per_sample)
        else:
            measured = measurements(asyncio.run(gather(address[0], address[1], secret=secret, tls=tls)))
        tuning = tune(measured, trials=trials, seed=seed, max_layers=max_layers,
                      bandwidth=bandwidth, latency=latency)
    except KeyboardInterrupt:
        return
    except (OSError, CrnetError, ValueError, asyncio.TimeoutError) as e:
        # The message may quote what a node sent: tamed. (ValueError: the model refused
        # what was measured, e.g. a node's absurd numbers.)
        raise click.ClickException(f"{where}: {tamed(str(e)) or 'no answer'}") from None
    if write is not None:
        try:
            with open(write, "w") as f:
                f.write(config_text(tuning))
        except OSError as e:
            raise click.ClickException(f"cannot write {write}: {e.strerror or e}") from None
    if as_json:
        click.echo(json.dumps(tuning.to_json(top)))
        return
    _print(tuning, top)
    if write is not None:
        best = tuning.ranking[0]
        click.echo(f"\nwrote {write}: {best.scheme} {best.shape} (crnetd --role master --config "
                   f"{write}; a restart of the tree applies it)")


def _print(t, top: int) -> None:
    from ..defaults import PROBE_ROUNDS
    from ..units import format_rate, format_seconds, plural

    m, run = t.measurements, t.measurements.running
    measured = ("no consecutive steps yet" if t.measured_mean is None else
                f"mean step {format_seconds(t.measured_mean)}, p95 "
                f"{format_seconds(t.measured_p95)} over the last {len(m.periods)} steps")
    p = m.probe
    if p is not None:
        measured = (f"a probe, not training: {format_bytes(p.bytes)} to each child "
                    f"{PROBE_ROUNDS} times" + ("" if p.throughput is None else
                                              f" ({format_rate(p.throughput)} send to echo)"))
    click.echo(f"tree        {plural(run.workers, 'worker')} (+ the master), m = {run.samples} "
               f"samples, {format_bytes(run.vector_bytes)} vectors: {measured}")
    if p is not None:
        click.echo(f"probe       kernel {format_seconds(p.kernel_seconds)} on the fastest host; "
                   + ("hosts' times scaled to --per-sample" if p.per_sample is not None else
                      "no --per-sample: the kernel's time stands in for one sample's (only the "
                      "hosts' relative speeds and noise are measured)"))
    law = t.compute.model
    steps = "kernel runs" if p is not None else "host steps"
    click.echo(f"compute     {law.describe()} per sample, from {t.compute.samples} {steps}"
               + ("" if law.kind == "empirical" else f" (Kolmogorov-Smirnov distance "
                  f"{t.compute.distance:.3f}; empirical: {t.compute.empirical.describe()})"))
    slow = sorted(t.hosts.items(), key=lambda kv: -kv[1].model.mean_time(1))[:3]
    if slow:
        click.echo("slowest     " + ", ".join(
            f"{tamed(name) or 'master'} {format_seconds(fit.model.mean_time(1))}/sample"
            for name, fit in slow))
    if m.unmeasured:
        click.echo("unmeasured  " + ", ".join(tamed(n) for n in m.unmeasured))
    click.echo(f"links       {format_rate(t.links.bandwidth)}, latency "
               f"{format_seconds(t.links.latency)} (from {plural(t.links.pairs, 'link')})")
    click.echo()
    click.echo(f"running     (rank {t.running_rank or '-'} of {len(t.ranking)}), "
               f"measured mean {'-' if t.measured_mean is None else format_seconds(t.measured_mean)}:")
    prediction_table([t.running])
    click.echo()
    click.echo(f"best {min(top, len(t.ranking))} of {len(t.ranking)}:")
    prediction_table(t.ranking[:top], numbered=True)
    auto = t.plan_auto
    click.echo("\nplan auto   " + ("keeps the running plan" if auto is None else
                                  f"runs {auto.scheme} {auto.shape} from the next job on")
               + " (crnetd --role master --plan auto)")
