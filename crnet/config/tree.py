"""The tree a command's --scheme/--workers/--fanout/--layers/--stragglers describe.

The options themselves are records in ``crnet.config.options`` (crnetd's master takes them, and
so do ``crnet plan``, ``demo``, ``run`` and ``model``); here they become a ``Tree``, or a
usage error (exit 2) saying what is wrong.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from ..coding.plan import Tree, scheme_tree


def stragglers_in_effect(fanout: list[int], stragglers: list[int]) -> list[int]:
    """--stragglers as typed (or set by env or file); its default (1) at most each layer's
    fanout - 1, as a fanout of 1 has no child to lose. One rule for crnetd and every command
    that builds a tree; the command's click context says whether the value is the default."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.get_parameter_source("stragglers") is not ParameterSource.DEFAULT:
        return list(stragglers)
    return [min(s, fanout[min(i, len(fanout) - 1)] - 1) for i, s in enumerate(stragglers)]


def resolve_layers(fanout: list[int], layers: int | None, stragglers: list[int]) -> int:
    """--layers, or the length of the longer list, else 2."""
    if layers is None:
        longest = max(len(fanout), len(stragglers))
        layers = longest if longest > 1 else 2
    return layers


def tree_from_options(fanout, layers, stragglers) -> Tree:
    """The tree the options describe, or a usage error saying what is wrong."""
    try:
        return Tree.from_options(fanout, stragglers_in_effect(fanout, stragglers), layers)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def tree_for_scheme(scheme, workers, fanout, layers, stragglers) -> Tree:
    """The tree ``plan.scheme_tree`` gives for the options, or a usage error."""
    stragglers = stragglers_in_effect(fanout, stragglers)
    tree = None
    if scheme in ("cr", "tree", "spread") or workers is None:
        s = stragglers if scheme != "tree" else [0]
        tree = tree_from_options(fanout, resolve_layers(fanout, layers, stragglers), s)
    if scheme in ("cr", "spread") and tree is not None and workers not in (None, tree.workers):
        raise click.UsageError(f"--workers {workers} but the {scheme} tree has {tree.workers} workers")
    try:
        return scheme_tree(scheme, tree=tree, workers=workers, stragglers=stragglers[0])
    except ValueError as e:
        raise click.UsageError(str(e)) from None
