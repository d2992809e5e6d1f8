"""crnet's benchmarks: they live in the source checkout and are not part of the ``crnet`` wheel.

They need root (network namespaces) or plenty of memory, and ``python -m benchmarks`` needs
the ``bench`` extra (matplotlib, torch), so install the checkout with
``pip install -e '.[bench]'`` and run everything from the repository root (the installed
``crnet`` never imports this package; ``python -m benchmarks`` only points here):

``python -m benchmarks`` (``__main__.py``)
    every scheme and PyTorch's Gloo on an emulated cluster (root), compared with the
    run-time model: ``python -m benchmarks --preset quick``. Built from ``presets.py`` (the
    scenarios), ``runner.py`` (one cluster per preset, every scheme on it), ``worker.py``
    (an emulated training process per host), ``gloo_run.py`` and ``gloo_peer.py`` (the
    PyTorch Gloo baseline) and ``report.py`` (tables, bench.json, the plot).
``netns.py``
    the emulated cluster: network namespaces on a bridge, tbf-shaped links (root).
``python -m benchmarks.netns_cluster up --hosts 4 --rate 100mbit`` (``status``, ``down``)
    brings such a cluster up or down from the shell.
``python -m benchmarks.bench_kernels``
    the coded-sum kernel against numpy and ``np.copyto``.
``python -m benchmarks.bench_hop``
    one parent's aggregate receive throughput from its children, on loopback.
``python -m benchmarks.bench_step``
    the step time of a 13-node tree on loopback, per vector size.
``python -m benchmarks.bench_tune``
    ``crnet tune``'s pick after a poor start against every scheme, on an emulated cluster (root).

``_machine.py`` holds the machine-load helpers bench_hop and bench_step share.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent   # the source checkout this package lives in


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: ours) with the checkout first on PYTHONPATH.

    A process started as ``python -m benchmarks.<module>`` then finds this package (and the
    checkout's ``crnet`` next to it) whatever its working directory.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env
