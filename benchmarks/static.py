"""What leaving a static rendering costs the kernel when a cell ends: each view drawn as matplotlib PNGs and HTML.

    python benchmarks/static.py [--reps 7] [--markdown PATH]

Each case renders one view's static bundle (``mpinb/widgets/static.py``) from data shaped like a real cell's,
--reps times after one warm-up (matplotlib imported and its fonts cached, as ``views.warm_up`` does when the
extension loads). Reported: the median per bundle and per chart in it, against the budget of 150 ms per chart.
Cases:
  live charts      4 ranks × 1,000 steps of 2 metrics (2 charts), with the per-rank table.
  gradient view    16 layers × 4 ranks, 4 flagged: the heatmap and the flagged layers' histograms (5 charts: a
                   histogram panel counts as one), with the table.
  inspector        4 leaves × 4 ranks with 64-bin histograms: 4 histogram panels (4 charts), with the tables.
  timeline         4 ranks × 5,000 traced calls of 2 operations (1 chart), with the summary.
"""

import argparse
import datetime
import platform
import statistics
import time

import numpy as np
from results import publish

from mpinb.notebook.models.history import History
from mpinb.notebook.models.leaf_reports import inspect_gathered
from mpinb.notebook.models.traces import frame, summarize
from mpinb.wire.array_stats import leaf_stats
from mpinb.widgets import static, timeline_static
from mpinb.widgets.grads import grad_report

MARK = "<!-- static renderings -->"
BUDGET = 0.150  # seconds per chart


def metrics_case():
    history = History()
    for rank in range(4):
        history.add(rank, [("main", s, s * 0.01, {"loss": 1 / (s + 1) + rank * 0.1, "accuracy": s / 1000})
                           for s in range(1000)])
    return lambda: static.metrics_bundle(history, ["main"]), 2


def grads_case():
    rng = np.random.default_rng(0)
    per_rank = {}
    for rank in range(4):
        layers = {}
        for i in range(16):
            counts, edges = np.histogram(rng.normal(size=1000), bins=64)
            layers[f"layer{i}.weight"] = {"kind": "parameter", "shape": [64, 64], "norm": 1.0, "diff": 0.0,
                                          "scale": 1.0, "grad_norm": float(rng.uniform(0.5, 1.5)),
                                          "grad_diff": 0.1 if i % 5 == 0 else 0.0, "grad_scale": 1.0,
                                          "grad_histogram": (counts.tolist(), edges.tolist())}
        per_rank[rank] = layers
    reports = grad_report(per_rank)
    return lambda: static.grads_bundle(reports), 1 + 4  # the heatmap, the 4 flagged layers' histograms


def inspector_case():
    rng = np.random.default_rng(1)
    gathered = {f"t{i}": {rank: rng.normal(size=10_000).astype(np.float32) for rank in range(4)} for i in range(4)}
    stats = {name: {rank: {(): leaf_stats(value, "float32", "cpu")} for rank, value in per_rank.items()}
             for name, per_rank in gathered.items()}
    reports = inspect_gathered(gathered, stats)
    return lambda: static.inspector_bundle(reports), 4  # a histogram panel per leaf


def timeline_case():
    spans = {}
    for rank in range(4):
        starts = np.cumsum(np.full(5000, 1e-3))
        spans[rank] = [("Allreduce" if i % 2 else "Bcast", "COMM_WORLD", -1, 1024, 1024, int(t * 1e9),
                        int((t + 4e-4) * 1e9), i, "collective", "") for i, t in enumerate(starts)]
    trace = frame(spans)
    summary = summarize(trace)
    return lambda: timeline_static.timeline_bundle(trace, summary), 1


CASES = [("live charts: 4 ranks × 1,000 steps, 2 metrics", metrics_case),
         ("gradient view: 16 layers × 4 ranks", grads_case),
         ("tensor inspector: 4 leaves × 4 ranks", inspector_case),
         ("timeline: 4 ranks × 5,000 calls", timeline_case)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    lines = [MARK, "", f"Static renderings at the end of a cell (`python benchmarks/static.py`, {args.reps} runs "
             f"each, median; {platform.machine()}, {datetime.date.today()}):", "",
             "| view | charts | per bundle | per chart | budget per chart | per chart ÷ budget |",
             "|---|---|---|---|---|---|"]
    for name, case in CASES:
        render, charts = case()
        render()  # warm-up: fonts, colour maps
        times = []
        for _ in range(args.reps):
            started = time.perf_counter()
            render()
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        lines.append(f"| {name} | {charts} | {median * 1e3:.0f} ms | {median / charts * 1e3:.0f} ms | "
                     f"{BUDGET * 1e3:.0f} ms | {median / charts / BUDGET:.2f} |")
    lines += ["", MARK]
    publish("\n".join(lines), args.markdown, MARK)


if __name__ == "__main__":
    main()
