"""``crnetd`` (and ``crnet daemon``): one host of the tree.

Its options are the table in ``crnet.config.options``; this module adds the two that say where
they come from (--config, --check-config) and hands the merged values to
``crnet.config.effective``, which makes them the daemon's ``Settings``.
"""

from __future__ import annotations

import click

from ..config.options import DAEMON_OPTIONS, apply


def _read_config(ctx, param, path):
    from ..config.effective import read_config

    read_config(ctx, path)


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                 "auto_envvar_prefix": "CRNET"})
@apply(DAEMON_OPTIONS)
@click.option("--config", type=click.Path(dir_okay=False), default=None, is_eager=True,
              expose_value=False, callback=_read_config,
              help="A TOML file of options (keys: the long option names with _, e.g. "
                   "client_socket); flags and CRNET_* variables win over it.")
@click.option("--check-config", is_flag=True, allow_from_autoenv=False,
              help="Print the effective configuration (each value and where it came from) "
                   "and exit: 0 if it is good, 2 naming what is wrong.")
@click.pass_context
def crnetd(ctx, check_config, log_level, log_format, **options):
    """The crnet daemon: one host of the CodedReduce tree.

    \b
    crnetd --role master --listen 0.0.0.0:7070 --fanout 3 --layers 2 --stragglers 1 \\
           --samples 60000 --secret-file /etc/crnet/secret
    crnetd --role node --parent master-host:7070 --listen 0.0.0.0:7071 \\
           --secret-file /etc/crnet/secret

    Every option can also be set as CRNET_<OPTION>, e.g. CRNET_CLIENT_SOCKET, or in the
    --config file; a flag wins over CRNET_*, which wins over the file (docs/operations.md).
    """
    from ..config.effective import effective_config
    from ..node import run_node
    from ..node.observe.logs import setup_logging

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
