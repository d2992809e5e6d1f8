"""``crnet status``: the tree under a node, as its status service tells it."""

from __future__ import annotations

import json

import click

from ..config.types import Address
from ..errors import CrnetError
from ..peer_text import tamed
from .shared import credential_options, credentials


@click.command("status", short_help="Show the tree under a node: who is joined, slow or missing.")
@click.argument("address", type=Address())
@credential_options
@click.option("--json", "as_json", is_flag=True, help="Print the tree as one JSON object, "
              "with every node's measured section (crnet tune's windows).")
@click.option("--watch", type=click.FloatRange(min=0.5), is_flag=False, flag_value=2.0,
              default=None, help="Refresh every SECONDS (2 if not given) until Ctrl-C.")
def status_command(address, secret_file, tls_cert, tls_key, tls_ca, as_json, watch):
    """Show the tree under a node (ask the master for all of it): every node's name, host,
    address, state, last step time and how often it straggled, and who is missing.

    \b
    crnet status master-host:7070 --secret-file /etc/crnet/secret
    """
    from ..defaults import TUNE_WINDOW_MAX
    from ..tools.status import StatusClient

    secret, tls = credentials(secret_file, tls_cert, tls_key, tls_ca)

    async def ask() -> None:
        client = await StatusClient.connect(address[0], address[1], secret=secret, tls=tls)
        try:
            tree = client.first
            if as_json:
                tree = await client.refresh(measured=TUNE_WINDOW_MAX)
            while True:
                assert tree is not None
                click.echo(json.dumps(tree) if as_json else _status_text(tree))
                if watch is None:
                    return
                await asyncio.sleep(watch)
                tree = await client.refresh(measured=TUNE_WINDOW_MAX if as_json else 0)
        finally:
            client.close()

    import asyncio

    try:
        asyncio.run(ask())
    except KeyboardInterrupt:
        pass
    except (OSError, CrnetError, asyncio.TimeoutError) as e:
        # The message may quote what the node sent (a refusal's reason).
        raise click.ClickException(f"{address[0]}:{address[1]}: {tamed(str(e)) or 'no answer'}") from None


def _status_text(tree: dict) -> str:
    """The table. Every name, host and address is the nodes' own word (a node with the
    secret may say anything): each goes through ``tamed``, so an escape sequence or a
    newline is printed as ``\\x1b``, ``\\n``, never acted on or starting a line."""
    from ..tools.status import missing, rows

    lines = [f"{'NODE':<14} {'HOST':<20} {'ADDRESS':<22} {'STATE':<13} {'STEP':>7} "
             f"{'LAST STEP':>10} {'STRAGGLED':>10}"]
    for r in rows(tree):
        last = "-" if r.last_step_seconds is None else f"{1e3 * r.last_step_seconds:.1f} ms"
        straggled = "-" if r.recent is None else f"{r.straggled}/{r.recent}"
        lines.append(f"{'  ' * r.depth + tamed(r.name):<14} {tamed(r.host or '-'):<20} "
                     f"{tamed(r.address or '-'):<22} {tamed(r.state):<13} {r.tree_step:>7} "
                     f"{last:>10} {straggled:>10}")
    gone = missing(tree)
    lines.append("missing now: " + (", ".join(f"{tamed(r.name)} ({tamed(r.host or 'host unknown')})"
                                              for r in gone) if gone else "none"))
    return "\n".join(lines)

