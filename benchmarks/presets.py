"""The benchmark's scenarios. Compute is emulated (``crnet.tune.workload``), links are shaped.

Per-sample times are chosen so a worker's normal uncoded compute is about 20 ms per
step (20,000 samples over 20 workers at 20 us): long next to the aggregation of a
20 kB vector, short enough that a run of 40 steps takes seconds. ``large`` is where real
models live: a 4 MB vector on 1 Gbit/s links (a ring step moves it in ~70 ms) and 100 ms of
uncoded compute, so a 10x straggler costs about 0.9 s. ``correlated`` slows pairs of sibling
workers together (``grouped:A,P,F,G``): more than the s = 1 their parent tolerates, which is
where CodedReduce with ``--beyond-s approximate`` (the ``cr-approx`` row) differs from ``cr``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from crnet.coding.plan import Tree
from crnet.defaults import CHUNK_BYTES


@dataclass(frozen=True)
class Preset:
    name: str
    workers: int
    cr_tree: Tree | None            # CodedReduce's shape (tree uses it with s = 0); None: the
                                    # model's best (what `crnet plan --auto` would pick)
    gc_stragglers: int | None       # gradient coding's s on the star of all workers; None: best
    samples: int
    elements: int                   # float32 elements per vector
    rate: str | None                # every host link, both directions (crnet.units: 1gbit)
    compute: str                    # crnet.tune.workload.ComputeModel spelling
    steps: int
    freeze: tuple[int, int] | None = None   # (worker index, step): that host freezes (SIGSTOP)
    deadline: float = 120.0         # seconds a scheme may run
    timeout: float = 10.0           # crnetd --timeout and the clients' per-step timeout
    latency: float = 60e-6          # per-message latency for the model until calibrated
    chunk_bytes: int = CHUNK_BYTES
    about: str = ""
    tree_shape: Tree | None = None  # the `tree` scheme's fanout (s = 0); None: the model's best
    spread_tree: Tree | None = None  # spread's shape; None: the model's best if cr's is, else cr's
    persistent: bool = False        # crnet's workers finish every computation (cannot stop)
    burst: str | None = None        # every link's tbf bucket (a tc size); None: netns's default
    patience: float | None = None   # cr-approx's crnetd --patience; None: the daemons' default
    bandwidth: float | None = None  # the model's per-host rate (bytes/s); None: ``rate``'s
                                    # (set from calibration on unshaped links: runner.calibrate)

    @property
    def vector_bytes(self) -> int:
        return 4 * self.elements


PRESETS = {
    "stragglers": Preset(
        "stragglers", workers=20, cr_tree=None, gc_stragglers=None, samples=20000,
        elements=5000, rate="1gbit", compute="straggle:2e-5,0.1,10", steps=80,
        about="20 workers, 5,000-float32 vectors, each worker 10x slower with p = 0.1 per step"),
    "heavy-tail": Preset(
        "heavy-tail", workers=20, cr_tree=None, gc_stragglers=None, samples=20000,
        elements=5000, rate="1gbit", compute="shifted-exp:1e-5,1e5", steps=60,
        about="the paper's shifted exponential compute times (mean 2x the shift)"),
    "dead": Preset(
        "dead", workers=20, cr_tree=Tree((4, 4), (1, 1)), gc_stragglers=3, samples=20000,
        elements=5000, rate="1gbit", compute="fixed:2e-5", steps=30, freeze=(19, 5),
        deadline=60.0, timeout=5.0,
        about="one worker frozen (SIGSTOP, host and daemon) from step 5"),
    "bandwidth": Preset(
        "bandwidth", workers=20, cr_tree=Tree((4, 4), (1, 1)), gc_stragglers=3, samples=20000,
        elements=1_000_000, rate="100mbit", compute="fixed:1e-7", steps=6, deadline=300.0,
        timeout=60.0,
        about="4 MB vectors on 100 Mbit/s links, no stragglers: the ring's home ground"),
    "large": Preset(
        "large", workers=20, cr_tree=None, gc_stragglers=None, samples=20000,
        elements=1_000_000, rate="1gbit", compute="straggle:1e-4,0.1,10", steps=20,
        deadline=300.0, timeout=30.0,
        about="4 MB vectors on 1 Gbit/s links, each worker 10x slower with p = 0.1 per step"),
    # Where real clusters train: links faster than the hosts can feed them (here unshaped
    # veth, so the machine's CPUs bound every transfer: runner.calibrate measures that rate
    # for the model), a 64 MB gradient and 200 ms of uncoded compute.
    "fast": Preset(
        "fast", workers=8, cr_tree=None, gc_stragglers=None, samples=20000,
        elements=16 << 20, rate=None, compute="straggle:8e-5,0.1,10", steps=20, deadline=600.0,
        timeout=60.0,
        about="8 workers, 64 MB vectors on unshaped links, 200 ms of uncoded compute, each "
              "worker 10x slower with p = 0.1 per step"),
    "fast-calm": Preset(
        "fast-calm", workers=8, cr_tree=None, gc_stragglers=None, samples=20000,
        elements=16 << 20, rate=None, compute="fixed:8e-5", steps=20, deadline=600.0,
        timeout=60.0, about="the fast preset without stragglers"),
    "quick": Preset(
        "quick", workers=6, cr_tree=Tree((2, 2), (1, 1)), gc_stragglers=1, samples=1200,
        elements=5000, rate="1gbit", compute="straggle:1e-4,0.2,5", steps=8, deadline=60.0,
        timeout=10.0, about="CI smoke run: 6 workers, a few steps"),
    # Fanout 2,4 with s 0,1; groups of 2 consecutive workers (in tree order): the master's
    # two children, then pairs of one bottom parent's four children (an FRC group of its
    # code). A slow pair is one more straggler than that parent tolerates, and the master
    # (s = 0) cannot do without the parent: with --beyond-s fail the step waits for the pair.
    "correlated": Preset(
        "correlated", workers=10, cr_tree=Tree((2, 4), (0, 1)), gc_stragglers=1, samples=20000,
        elements=5000, rate="1gbit", compute="grouped:2e-5,0.1,10,2", steps=60, deadline=120.0,
        timeout=10.0, patience=0.15,
        about="10 workers, pairs of siblings 10x slower together with p = 0.1 per pair and "
              "step (more than the s = 1 their parent tolerates): run cr and cr-approx"),
}

SWEEP_PROBS = (0.0, 0.05, 0.1, 0.2, 0.3)
SWEEP_FACTORS = (5.0, 10.0)


def sweep_points(base: Preset):
    """The stragglers preset over straggle probability x slowdown (shorter runs)."""
    a = base.compute.split(":", 1)[1].split(",")[0]
    for factor in SWEEP_FACTORS:
        for prob in SWEEP_PROBS:
            yield replace(base, name=f"sweep p={prob:g} f={factor:g}",
                          compute=f"straggle:{a},{prob:g},{factor:g}", steps=min(base.steps, 25))
