"""What several commands share: the tree's options and a few ways of saying things."""

from __future__ import annotations

import click

from ..options import SCHEME_OPTIONS, TREE_OPTIONS, apply

tree_options = apply(TREE_OPTIONS)
"""--fanout/--layers/--stragglers, for every command that builds a tree."""

scheme_options = apply(SCHEME_OPTIONS)
"""--scheme and --workers (the host count for the star-shaped schemes gc and rar)."""


def csv(values) -> str:
    return ",".join(str(v) for v in values)


def typed(ctx: click.Context, names) -> list[str]:
    """The options among ``names`` that were typed on the command line, as --spellings."""
    from click.core import ParameterSource

    params = {p.name: p for p in ctx.command.params}
    return [params[n].opts[0] for n in names
            if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
