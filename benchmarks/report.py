"""Tables, the bench.json summary line, and the plot."""

from __future__ import annotations

from pathlib import Path

ORDER = ("cr", "spread", "gc", "tree", "rar", "gloo")   # every scheme the benchmark runs
APPROX = ("cr-approx",)   # runs only when asked: cr with --beyond-s approximate (runner.VARIANTS)
ROWS = ("cr", *APPROX, *ORDER[1:])                      # the tables' order
SWEPT = ("spread", "rar", "gloo")   # what the sweep compares CR with


def table(doc: dict) -> str:
    """Per scheme: measured mean/median/p95, model, measured/model, CR's speedup."""
    schemes = doc["schemes"]
    cr = schemes.get("cr", {}).get("mean_s")
    lines = [f"preset {doc['preset']}: {doc.get('about', '')}",
             f"{'scheme':9} {'steps':>7} {'mean':>9} {'median':>9} {'p95':>9} {'model':>9} "
             f"{'model*':>9} {'meas/model*':>11} {'CR speedup':>10}  notes"]
    for name in [s for s in ROWS if s in schemes]:
        r = schemes[name]
        mean, model = r.get("mean_s"), r.get("model", {}).get("mean_s")
        same = r.get("model", {}).get("same_draws_mean_s")
        ratio = f"{mean / same:11.2f}" if mean and same else f"{'-':>11}"
        speed = f"{mean / cr:9.2f}x" if mean and cr and name != "cr" else f"{'-':>10}"
        notes = []
        if not r.get("correct", True):
            notes.append("WRONG RESULT")
        if r.get("stalled"):
            notes.append("stalled")
        if r.get("approximate_steps"):
            notes.append(f"{r['approximate_steps']} approximate, mean coverage "
                         f"{r['mean_coverage']:.3f}")
        if r.get("errors"):
            notes.append(r["errors"][0][:60])
        lines.append(f"{name:9} {r['steps_completed']:>3}/{r['steps']:<3} {_ms(mean)} "
                     f"{_ms(r.get('p50_s'))} {_ms(r.get('p95_s'))} {_ms(model)} {_ms(same)} "
                     f"{ratio} {speed}  " + "; ".join(notes))
    lines.append("model: expected over the compute distribution; model*: on this run's own "
                 "compute draws (steps 1..S-1)" + ("; cr-approx: cr with --beyond-s approximate "
                                                   "(not modelled)" if "cr-approx" in schemes else ""))
    verdict = auto_verdict(doc)
    if verdict:
        lines.append(verdict)
    return "\n".join(lines)


def auto_verdict(doc: dict) -> str | None:
    """How ``plan --auto``'s pick did against the best crnet scheme measured.

    plan --auto chooses among crnet's schemes, so Gloo is not in the comparison, nor
    cr-approx (its results are not all exact), and a scheme that did not complete every
    step (it stalled) has no fair mean.
    """
    auto = doc.get("plan_auto")
    if not auto:
        return None
    measured = {k: r["mean_s"] for k, r in doc["schemes"].items()
                if k not in ("gloo", *APPROX) and r["mean_s"] and r["steps_completed"] == r["steps"]}
    line = f"plan --auto picks {auto['scheme']} ({auto['shape']})"
    if not measured:
        return line
    best = min(measured, key=measured.__getitem__)
    cfg = doc["config"]
    # spread on its own shape (cr's unless the preset's cr shape is the model's), tree on its
    # own fanout (cr's unless the preset names one).
    measured_shape = auto["tree"] is None or auto["scheme"] == "gc" or (
        auto["tree"] == [cfg["cr_fanout"], cfg["cr_stragglers"]] if auto["scheme"] == "cr"
        else auto["tree"] == [cfg.get("spread_fanout", cfg["cr_fanout"]),
                              cfg.get("spread_stragglers", cfg["cr_stragglers"])]
        if auto["scheme"] == "spread"
        else auto["tree"][0] == cfg.get("tree_fanout", cfg["cr_fanout"]))
    if auto["scheme"] in measured and measured_shape:
        return line + (f": measured {measured[auto['scheme']] / measured[best]:.2f}x the best crnet "
                       f"scheme that completed every step ({best})")
    if auto["scheme"] not in doc["schemes"] or not measured_shape:
        return line + f": not measured in this run (best measured: {best})"
    return line + f": it did not complete every step (best: {best})"


def speedups(point: dict) -> dict:
    """CR's speedup over each other scheme at one sweep point: measured, the model on
    the run's own draws, and the model's expectation."""
    s = point["schemes"]
    cr = s["cr"]
    out = {}
    for other, r in s.items():
        if other == "cr" or not (r["mean_s"] and cr["mean_s"]):
            continue
        same, cr_same = r["model"].get("same_draws_mean_s"), cr["model"].get("same_draws_mean_s")
        out[other] = {"measured": r["mean_s"] / cr["mean_s"],
                      "model": same / cr_same if same and cr_same else None,
                      "expected": r["model"]["mean_s"] / cr["model"]["mean_s"]}
    return out


def sweep_table(points: list[dict]) -> str:
    lines = ["sweep: CR's speedup in mean step time, measured / model on the same draws "
             "/ model expectation",
             f"{'p':>5} {'factor':>6} " + " ".join(f"{'CR/' + o:>22}" for o in SWEPT)]
    for p in points:
        sp = speedups(p)
        cells = []
        for other in SWEPT:
            v = sp.get(other)
            cells.append(f"{v['measured']:6.2f} / {v['model'] or 0:5.2f} / {v['expected']:5.2f}"
                         if v else f"{'-':>22}")
        lines.append(f"{p['prob']:>5g} {p['factor']:>6g} " + " ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def summary(doc: dict) -> dict:
    """The ``--json`` last line."""
    return {"preset": doc["preset"], "schemes": {
        name: {"mean_s": r.get("mean_s"), "p95_s": r.get("p95_s"),
               "model_s": r.get("model", {}).get("mean_s"),
               **({"approximate_steps": r["approximate_steps"], "mean_coverage": r["mean_coverage"]}
                  if name in APPROX else {})}
        for name, r in doc["schemes"].items()}}


def plot(docs: list[dict], sweep: list[dict] | None, path: Path) -> str | None:
    """Step-time distributions per scheme (and the sweep); None, or why there is no plot."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    panels = len(docs) + (1 if sweep else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2), squeeze=False)
    for ax, doc in zip(axes[0], docs):
        names = [s for s in ROWS if s in doc["schemes"] and doc["schemes"][s]["step_times"]]
        data = [[1e3 * t for t in doc["schemes"][s]["step_times"]] for s in names]
        if data:
            ax.boxplot(data, showmeans=True)
            ax.set_xticks(range(1, len(names) + 1), names)
        for i, s in enumerate(names, start=1):
            model = doc["schemes"][s].get("model", {}).get("mean_s")
            if model:
                ax.plot([i - 0.3, i + 0.3], [1e3 * model] * 2, "r--", lw=1)
        ax.set_title(f"{doc['preset']} (red: model mean)")
        ax.set_ylabel("step time (ms)")
        ax.set_yscale("log")
    if sweep:
        ax = axes[0][-1]
        for factor in sorted({p["factor"] for p in sweep}):
            pts = sorted((p for p in sweep if p["factor"] == factor), key=lambda p: p["prob"])
            for other, style in zip(SWEPT, ("^", "o", "s")):
                got = [(p["prob"], v) for p in pts if (v := speedups(p).get(other))]
                if got:
                    xs = [x for x, _ in got]
                    ax.plot(xs, [v["measured"] for _, v in got], style + "-",
                            label=f"CR/{other} measured, f={factor:g}")
                    ax.plot(xs, [v["model"] for _, v in got], style + ":",
                            label=f"CR/{other} model, f={factor:g}")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xlabel("straggle probability")
        ax.set_ylabel("speedup of CR (mean step time)")
        ax.set_title("stragglers sweep (dotted: model on the same draws)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _ms(x) -> str:
    return f"{'-':>9}" if x is None else f"{1e3 * x:7.1f}ms"
