"""A notebook's ``%%mpi`` cells, in order, as a script for ``mpiexec -n N python script.py`` (and a Slurm job
that runs it).

Each ``%%mpi`` cell becomes a section of the script, preceded by what the ranks have predefined under
``%%mpi`` (``comm``, ``rank``, ``size``, ``MPI``). ``--ranks`` becomes an ``if rank in ...`` around the cell;
options that only change what the notebook shows (``--gather``, ``--timeout``, ``--stream``) are noted in a
comment. Cells that run in the notebook itself, and ``%%mpi`` cells tagged ``raises-exception`` (a tutorial's error
shown on purpose), are left out, each with a comment that says so. A ``%%mpi`` cell
that uses IPython syntax (``%timeit``, ``!ls``) cannot run as plain Python: export stops and names it.
"""

import os
import shlex
import sys
import textwrap
from datetime import date

import nbformat

PRELUDE = """\
from mpi4py import MPI

comm = MPI.COMM_WORLD  # what %%mpi predefines on every rank
rank, size = comm.rank, comm.size
"""


class ExportError(ValueError):
    """A notebook that cannot become a script as it is; the message names the cell and what to change."""


def export(notebook, *, name="notebook.ipynb"):
    """The script for *notebook* (an ``nbformat`` notebook, or a path); returns ``(script text, ranks)``.

    *ranks* is the world size the notebook asks for (``%mpi start -n N`` or ``%%mpi -n N``), or ``None``.
    """
    if isinstance(notebook, (str, os.PathLike)):
        name = os.path.basename(notebook)
        notebook = nbformat.read(notebook, as_version=4)
    sections, ranks, cells = [], None, 0
    for number, cell in enumerate(notebook.cells, start=1):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        first, _, body = cell.source.lstrip("\n").partition("\n")
        if first.split()[:1] == ["%%mpi"] and "raises-exception" in cell.metadata.get("tags", ()):
            sections.append(_left_out(number, cell.source, "is tagged raises-exception: it fails on purpose, to "
                                                           "show the error"))
        elif first.split()[:1] == ["%%mpi"]:
            options = _options(first, number)
            ranks = options.n or ranks
            sections.append(_mpi_section(number, options, body))
            cells += 1
        else:
            ranks = _started_size(cell.source) or ranks
            sections.append(_left_out(number, cell.source))
    if not cells:
        raise ExportError(f"{name} has no %%mpi cell: nothing would run on the ranks")
    run = f"mpiexec -n {ranks or 'N'} python SCRIPT"
    header = (f"# Exported from {name} by `mpinb export` on {date.today().isoformat()}: its {cells} %%mpi "
              f"cell{'s' if cells != 1 else ''}, in order.\n# Run: {run}\n")
    return "\n\n".join([header + PRELUDE, *sections]) + "\n", ranks


def sbatch(script, *, ranks, partition=None, time=None, account=None, mpiexec=None, python=None):
    """A Slurm job script that runs *script* on *ranks* tasks with this environment's ``mpiexec`` and Python."""
    from .world import Placement
    from .world.mpis import default_mpiexec

    stem = os.path.splitext(os.path.basename(script))[0]
    command = [mpiexec or default_mpiexec(), "-n", "$SLURM_NTASKS", python or sys.executable,
               os.path.abspath(script)]
    body = ["", "# mpiexec finds the job's nodes itself (MPICH and Open MPI read Slurm's allocation)",
            " ".join(word if word.startswith("$") else shlex.quote(word) for word in command)]
    placement = Placement(launcher="slurm", partition=partition, time=time, account=account)
    return placement.start().export_script([f"--job-name={stem}", f"--ntasks={ranks}", f"--output={stem}-%j.out"],
                                           body)


def _options(line, number):
    from .arguments import parse_cell_line

    try:
        return parse_cell_line(line.split(None, 1)[1] if " " in line else "")
    except Exception as exc:  # noqa: BLE001 - the parser raises UsageError; say which cell
        raise ExportError(f"cell {number}: cannot read {line.strip()!r}: {exc}") from None


def _mpi_section(number, options, body):
    _check_plain_python(number, body)
    notes = []
    if options.gather:
        notes.append(f"--gather {' '.join(options.gather)}: the values stay on each rank")
    if options.timeout:
        notes.append(f"--timeout {options.timeout:g}: no limit here")
    head = f"# ---- cell {number}: %%mpi" + "".join(f"\n# ({note})" for note in notes)
    code = body.rstrip()
    if options.ranks:
        code = (f"if rank in __import__('mpinb.wire.ranks', fromlist=['parse_ranks']).parse_ranks({options.ranks!r}, "
                f"size):  # --ranks {options.ranks}\n" + textwrap.indent(code or "pass", "    "))
    return f"{head}\n{code}"


def _left_out(number, source, why="runs in the notebook only"):
    commented = textwrap.indent(source.rstrip(), "# ", lambda line: True)
    return f"# ---- cell {number} {why} (left out):\n{commented}"


def _check_plain_python(number, body):
    from IPython.core.inputtransformer2 import TransformerManager

    transformed = TransformerManager().transform_cell(body)
    if "get_ipython()" in transformed and "get_ipython()" not in body:
        plain, ipython = body.splitlines(), transformed.splitlines()
        where = next((i for i, (a, b) in enumerate(zip(plain, ipython)) if a != b), 0)
        raise ExportError(
            f"cell {number} line {where + 1} is IPython syntax, which a script cannot run: "
            f"{plain[where].strip() if where < len(plain) else ''!r}. Write it in plain Python (subprocess for "
            "!commands, time.perf_counter for %time), or move it to a notebook cell."
        )
    try:
        compile(body, f"<cell {number}>", "exec")
    except SyntaxError as exc:
        raise ExportError(f"cell {number} line {exc.lineno}: {exc.msg}") from None


def _started_size(source):
    """N from a ``%mpi start -n N`` or ``%mpi restart -n N`` line, if the cell has one."""
    for line in source.splitlines():
        words = line.split()
        if words[:2] in (["%mpi", "start"], ["%mpi", "restart"]) and "-n" in words[:-1]:
            value = words[words.index("-n") + 1]
            if value.isdigit():
                return int(value)
    return None
