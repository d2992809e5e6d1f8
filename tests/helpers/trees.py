"""Real trees of crnetd processes (``local_tree`` in ``tests/conftest.py`` starts them)."""

from __future__ import annotations

import signal

from crnet.coding.plan import Tree
from crnet.tools.launch import MASTER

KILL = signal.SIGKILL


def workers(tree: Tree) -> list[str]:
    """The hosts of ``tree`` other than the master."""
    return [name for name in tree.names() if name != MASTER]
