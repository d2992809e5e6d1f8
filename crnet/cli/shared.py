"""What several commands share: the tree's options and a few ways of saying things."""

from __future__ import annotations

import click

from ..config.options import SCHEME_OPTIONS, TREE_OPTIONS, apply

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


def credential_options(f):
    """--secret-file and --tls-*, for the commands that ask a node (status, tune)."""
    for option in reversed((
            click.option("--secret-file", type=click.Path(dir_okay=False), default=None,
                         envvar="CRNET_SECRET_FILE", help="The cluster secret, as crnetd's."),
            click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
                         envvar="CRNET_TLS_CERT", help="As crnetd's, if the tree uses TLS."),
            click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None,
                         envvar="CRNET_TLS_KEY"),
            click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None,
                         envvar="CRNET_TLS_CA"))):
        f = option(f)
    return f


def credentials(secret_file, tls_cert, tls_key, tls_ca):
    """(secret, TlsFiles) from ``credential_options``' values; usage errors as click's."""
    from ..protocol.auth import load_secret
    from ..protocol.tls import TlsFiles

    secret = None
    if secret_file is not None:
        try:
            secret = load_secret(secret_file)
        except (OSError, ValueError) as e:
            raise click.BadParameter(str(e), param_hint="--secret-file") from None
    given = [v for v in (tls_cert, tls_key, tls_ca) if v is not None]
    if given and len(given) < 3:
        raise click.UsageError("--tls-cert, --tls-key and --tls-ca come together")
    return secret, (TlsFiles(tls_cert, tls_key, tls_ca) if given else None)
