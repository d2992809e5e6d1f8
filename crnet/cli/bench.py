"""``crnet bench``: moved to ``python -m benchmarks`` (the benchmarks live in the clone only).

The installed ``crnet`` does not carry the ``benchmarks/`` package and does not reach
into a clone for it; this command only says where the benchmark went.
"""

from __future__ import annotations

import shlex

import click


@click.command(short_help="Moved: python -m benchmarks, from a crnet clone (root).",
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                 "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args):
    """Moved: run python -m benchmarks (the same options) from the root of a crnet clone."""
    click.echo("crnet bench moved: run python -m benchmarks"
               + "".join(" " + shlex.quote(a) for a in args)
               + " from the root of a crnet clone (pip install -e '.[bench]')", err=True)
    raise SystemExit(2)
