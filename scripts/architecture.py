"""Draw docs/architecture.svg, the README's picture of a crnet cluster.

    python scripts/architecture.py            # needs matplotlib (pip install -e '.[bench]')

Hosts in a CodedReduce tree (fanout 3 drawn for the master, 2 layers): on every host a
crnetd and its training process(es), which share memory with it; coded chunks go up
the tree over TCP, and the exact sum comes back down to every host.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.fonttype"] = "none"   # text stays text: a small, diffable file
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "architecture.svg"

HOST_W, HOST_H = 2.3, 1.75
DAEMON = "#dbe9f6"
PROCESS = "#fde9c9"
SHM = "#e4f2df"


def host(ax, x: float, y: float, title: str, processes: int = 1, master: bool = False) -> None:
    # (The master's own process, if any, computes nothing: it only waits for the sum.)
    """One host: its crnetd, its training process(es) and the shared memory between them."""
    ax.add_patch(FancyBboxPatch((x, y), HOST_W, HOST_H, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc="white", ec="#555555", lw=1.2))
    ax.text(x + 0.1, y + HOST_H - 0.08, title, fontsize=8, weight="bold", va="top")
    ax.add_patch(FancyBboxPatch((x + 0.15, y + 0.92), HOST_W - 0.3, 0.4,
                                boxstyle="round,pad=0.01,rounding_size=0.05", fc=DAEMON, ec="#3a6ea5"))
    ax.text(x + HOST_W / 2, y + 1.12, "crnetd" + (" (master)" if master else ""), ha="center",
            va="center", fontsize=8)
    ax.add_patch(FancyBboxPatch((x + 0.15, y + 0.56), HOST_W - 0.3, 0.22,
                                boxstyle="round,pad=0.01,rounding_size=0.03", fc=SHM, ec="#4f8a3c"))
    ax.text(x + HOST_W / 2, y + 0.67, "shared memory", ha="center", va="center", fontsize=6.5)
    width = (HOST_W - 0.3 - 0.06 * (processes - 1)) / processes
    for p in range(processes):
        px = x + 0.15 + p * (width + 0.06)
        ax.add_patch(FancyBboxPatch((px, y + 0.1), width, 0.3,
                                    boxstyle="round,pad=0.01,rounding_size=0.03", fc=PROCESS,
                                    ec="#b7791f"))
        label = "training" if processes > 1 else "process (waits)" if master else "training process"
        ax.text(px + width / 2, y + 0.25, label,
                ha="center", va="center", fontsize=6.5)


def link(ax, start: tuple[float, float], end: tuple[float, float]) -> None:
    """A TCP link: coded chunks up (child to parent), the result down."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>", mutation_scale=9, lw=1.1,
                                 color="#444444"))


def main() -> int:
    fig, ax = plt.subplots(figsize=(12, 6.8))
    ax.set_xlim(0, 18)
    ax.set_ylim(0, 10)
    ax.axis("off")
    # the master (layer 0), three inner nodes (layer 1), their leaves (layer 2: 2 of 3 drawn)
    mx, my = 7.85, 7.0
    host(ax, mx, my, "host: master", master=True)
    inner = [(1.6, 4.0), (7.85, 4.0), (14.1, 4.0)]
    for i, (x, y) in enumerate(inner):
        host(ax, x, y, f"host: node {i}", processes=2 if i == 1 else 1)
        link(ax, (x + HOST_W / 2, y + HOST_H), (mx + HOST_W / 2, my))
        for j, dx in enumerate((-1.25, 1.25)):
            lx, ly = x + dx, 1.0
            host(ax, lx, ly, f"host: node {i}.{j}")
            link(ax, (lx + HOST_W / 2, ly + HOST_H), (x + HOST_W / 2, y))
        ax.text(x + HOST_W / 2, 0.7, "... n children per parent", ha="center", fontsize=7,
                color="#666666")
    ax.text(9.0, 0.15, "TCP links of the tree: coded chunks go up, each parent decodes from its "
            "fastest n - s children; the exact sum comes back down to every host.", ha="center",
            fontsize=8, color="#333333")
    ax.text(0.2, 9.8, "crnet: one crnetd per host, in a CodedReduce tree", fontsize=11,
            weight="bold", va="top")
    ax.text(0.2, 9.25, "A training process talks to its host's crnetd over a Unix\nsocket; "
            "vectors never cross it: they are in shared\nmemory (the gradient in, the sum out).",
            fontsize=8, va="top")
    OUT.parent.mkdir(exist_ok=True)
    fig.savefig(OUT, format="svg", bbox_inches="tight", metadata={"Date": None})
    if "--png" in sys.argv:
        fig.savefig(OUT.with_suffix(".png"), dpi=90, bbox_inches="tight")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
