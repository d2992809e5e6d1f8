"""``crnet run``: a local tree and a training process per host (``crnet.tools.run.Run``)."""

from __future__ import annotations

import sys

import click

from .. import defaults
from ..config.tree import tree_for_scheme
from ..errors import CrnetError
from ..tools.run import DEFAULT_SAMPLES, RESTART_PAUSE, Run
from .shared import scheme_options, tree_options


@click.command("run", context_settings={"allow_interspersed_args": False},
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
@click.option("--strict", is_flag=True,
              help="Strict daemons: an internal error stops one (exit 70) and fails the run "
                   "(exit 70 if every process succeeded), naming the daemon and its log.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Restarts in all (torchrun's convention): a training process that fails, or a "
                   "daemon that exits, while the run goes on is started again (the same command "
                   f"and seat, after {RESTART_PAUSE:g} s) while any are left; 0: the first failure "
                   "ends the run.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(scheme, workers, fanout, layers, stragglers, local_processes, samples, timeout, job,
        workdir, keep_logs, strict, max_restarts, command):
    """Start a local tree and one training process per host (K with --local-processes).

    \b
    crnet run --fanout 3 --layers 2 --stragglers 1 -- python train.py --lr 0.1

    Each process finds in its environment CRNET_CLIENT_SOCKET (so crnet.Client() needs no
    argument), CRNET_JOB, CRNET_HOST (its host's tree name; "" on the master),
    CRNET_LOCAL_PROCESS (0..K-1), CRNET_RANK (0..P-1, the master's host first) and
    CRNET_WORLD_SIZE (P). Every output line is prefixed with its host ([master], [0.1],
    [0.1/1] when K > 1). SIGINT, SIGTERM and SIGHUP are forwarded to the processes. With
    --max-restarts R, a process that fails (or a daemon that exits) is started again, the
    same command in the same seat, 0.5 s later, announced on stderr; a restarted process
    joins the running job (its client is stale: the README's loop takes the others' state).
    The R restarts are for the whole run, every process and daemon. When one fails with no
    restart left (with R = 0, the first failure), the others get 5 s, then SIGTERM. Exits
    with the exit code of that failure (killed by signal N: 128+N), else 0; every process
    is stopped.
    """
    tree = tree_for_scheme(scheme, workers, fanout, layers, stragglers)
    launcher = Run(tree, command, samples=samples, local_processes=local_processes, scheme=scheme,
                   timeout=timeout, job=job, workdir=workdir, keep_logs=keep_logs, strict=strict,
                   max_restarts=max_restarts, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer)
    try:
        code = launcher.run()
    except (CrnetError, OSError) as e:
        raise click.ClickException(str(e)) from None
    raise SystemExit(code)

