"""What another process on the machine does to the allreduce rows: the same cell idle and beside a spinner.

    python benchmarks/busy.py [--reps 15] [--markdown PATH]

Runs `bench.py`'s ResNet-18 allreduce cell (2 ranks) twice, first on an idle machine, then with one process
this script starts spinning on a core the whole time (stopped by its pid at the end). The ratios of the rows
`make bench` reports (allreduce_gradients against one flat Allreduce and against gloo) are given for both.
"""

import argparse
import contextlib
import io

from bench import allreduce_rows
from results import OtherLoad, one_core_busy, publish, shell

MARK = "<!-- busy machine -->"


def measure(ip, reps):
    with contextlib.redirect_stdout(io.StringIO()):
        rows = allreduce_rows(ip, reps)
    return {name: rows[name].median for name in ("bucketed", "flat", "gloo")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15, help="repetitions per case (default 15)")
    parser.add_argument("--markdown", help="also put the table in this file (its own section)")
    args = parser.parse_args()
    ip = shell()
    load = OtherLoad()
    idle = measure(ip, args.reps)
    idle_load = load.summary()
    with one_core_busy():
        busy = measure(ip, args.reps)
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    rows = ["| machine | allreduce_gradients | one flat Allreduce | gloo | flat ÷ ours | gloo ÷ ours |",
            "|---|---|---|---|---|---|"]
    for label, m in ((f"idle ({idle_load})", idle), ("one core kept busy by another process", busy)):
        rows.append(f"| {label} | {ms(m['bucketed'])} | {ms(m['flat'])} | {ms(m['gloo'])} | "
                    f"{m['flat'] / m['bucketed']:.2f} | {m['gloo'] / m['bucketed']:.1f}x |")
    header = (f"{MARK}\n## The allreduce rows on a busy machine\n\n`python benchmarks/busy.py --reps {args.reps}`: "
              "ResNet-18's gradients (45 MB), 2 ranks, medians.\n\n")
    publish(header + "\n".join(rows) + f"\n{MARK}", args.markdown, MARK)


if __name__ == "__main__":
    main()
