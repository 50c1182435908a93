"""The ``mpinb`` command: ``mpinb export NOTEBOOK -o script.py [--sbatch job.sbatch -n N]``."""

import argparse
import os
import sys

from .notebook.export import ExportError, export, sbatch


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mpinb", description="Tools for notebooks that drive MPI worlds.")
    commands = parser.add_subparsers(dest="command", required=True)
    ex = commands.add_parser(
        "export", help="write a notebook's %%%%mpi cells as a script for mpiexec (and a Slurm job)",  # %-formatted
        description="Write the notebook's %%mpi cells, in order, as a script that runs with "
                    "`mpiexec -n N python SCRIPT`; cells that run in the notebook, and cells tagged "
                    "raises-exception (they fail on purpose), are left out with a comment.")
    ex.add_argument("notebook", help="the .ipynb file")
    ex.add_argument("-o", "--output", required=True, help="the script to write")
    ex.add_argument("--sbatch", metavar="FILE", help="also write a Slurm job script that runs it")
    ex.add_argument("-n", type=int, default=None,
                    help="ranks for the job (default: the notebook's %%mpi start -n N or %%%%mpi -n N)")
    ex.add_argument("--partition", help="the job's partition")
    ex.add_argument("--time", help="the job's time limit, e.g. 01:00:00")
    ex.add_argument("--account", help="the account the job is charged to")
    args = parser.parse_args(argv)
    try:
        script, ranks = export(args.notebook)
    except (ExportError, OSError) as exc:
        parser.exit(2, f"mpinb export: {exc}\n")
    ranks = args.n or ranks
    if args.sbatch and not ranks:
        parser.exit(2, "mpinb export: the notebook does not say how many ranks it runs on: add -n N\n")
    with open(args.output, "w") as out:
        out.write(script.replace("python SCRIPT", f"python {args.output}"))
    print(f"wrote {args.output}: mpiexec -n {ranks or 'N'} {os.path.basename(sys.executable)} {args.output}")
    if args.sbatch:
        with open(args.sbatch, "w") as out:
            out.write(sbatch(args.output, ranks=ranks, partition=args.partition, time=args.time,
                             account=args.account))
        print(f"wrote {args.sbatch}: sbatch {args.sbatch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
