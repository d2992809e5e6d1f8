"""Command line: ``crnet`` (plan, demo, ...) and ``crnetd`` (the daemon).

One module per command; only option parsing and printing lives here, the work is done
by the library modules each one calls.
"""

from __future__ import annotations

import click

from .daemon import crnetd
from .demo import demo
from .model import model_command
from .plan import plan
from .run import run
from .status import status_command
from .tune import tune_command

__all__ = ["crnetd", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="crnet")
def main():
    """crnet: straggler-tolerant gradient aggregation (CodedReduce)."""


for command in (plan, demo, run, model_command, status_command, tune_command):
    main.add_command(command)
main.add_command(crnetd, name="daemon")
