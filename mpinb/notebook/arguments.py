"""The arguments of ``%mpi`` and ``%%mpi``, defined once: the magics parse with them and ``mpinb export`` reads
the ``%%mpi`` lines of a notebook with them."""

import argparse
import ipaddress
import re
import socket

from IPython.core import magic_arguments
from IPython.core.magic_arguments import MagicArgumentParser

from ..rank import faults
from .world import LAUNCHERS


class _Parser(MagicArgumentParser):
    """``%mpi``'s parser: a value its type refused in a sentence that names the option already (``-n takes ...``)
    is said once, after the command (``%mpi inject: --delay takes ...``), not after argparse's ``argument --delay:``."""

    def error(self, message):
        said = re.fullmatch(r"argument (\S+): (\1 takes .*)", message, flags=re.DOTALL)
        super().error(f"{self.prog}: {said[2]}" if said else message)


def count(text):
    """A number of ranks as written in ASCII digits (``int`` would also take ``١٢``, Arabic-Indic twelve)."""
    if not re.fullmatch(r"-?[0-9]+", text):  # a negative one is read, then refused with what a size must be
        raise argparse.ArgumentTypeError(f"-n takes a number of ranks written in digits 0-9, not {text!r}")
    return int(text)


def collective(text):
    """``--at``'s value: the collective a fault acts at, counted from 1, written in digits."""
    number = int(text) if re.fullmatch(r"-?[0-9]+", text) else text
    try:
        return faults.checked_at(number, "--at")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _number(text):
    """*text* as a float, or *text* itself when it is none (the check that follows names what is allowed)."""
    try:
        return float(text)
    except ValueError:
        return text


def delay(text):
    """``--delay``'s value: seconds a straggler sleeps before each collective (0 to ``faults.MAX_DELAY``)."""
    try:
        return faults.checked_delay(_number(text), "--delay")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def scale(text):
    """``--scale``'s value: the perturbing noise's standard deviation, finite and at least 0."""
    try:
        return faults.checked_scale(_number(text), "--scale")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def which_mpi(text):
    """``--mpi``'s value: not empty (an empty one would silently mean the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("--mpi takes mpich, openmpi, impi or the path of an mpiexec, not an empty "
                                         "string (leave --mpi out for the default)")
    return text


def address(text):
    """``--ip``'s value: an address of this machine's families, or a name that resolves to one."""
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    try:
        socket.getaddrinfo(text, None)
    except (socket.gaierror, UnicodeError):
        raise argparse.ArgumentTypeError(
            f"--ip takes an address of this host the ranks can reach (127.0.0.1, 10.0.0.5, 0.0.0.0 for every "
            f"interface) or a host name that resolves, not {text!r}") from None
    return text


CELL = [  # %%mpi's arguments, in the order its help lists them
    (("-n",), dict(type=count, default=None, help="number of ranks; starts a world of that size if none is running")),
    (("--ranks",), dict(default=None, help="run on these ranks only: 0,2 or 1-3 (default: all)")),
    (("--no-stream",), dict(dest="stream", action="store_false", default=None,
                            help="collect output and print it rank by rank when the cell ends")),
    (("--stream",), dict(dest="stream", action="store_true", default=None,
                         help="print output as it arrives, each line labelled [rank R] (default)")),
    (("--gather",), dict(nargs="+", default=None, metavar="NAME",
                         help="after the cell, NAME in the notebook is a mapping rank -> that rank's value")),
    (("--no-inspect",), dict(dest="inspect", action="store_false", default=True,
                             help="gather without showing the tensor inspector")),
    (("--timeout",), dict(type=float, default=None, metavar="S",
                          help="stop the cell after S seconds, showing where every rank still running is")),
    (("--trace",), dict(action="store_true", default=False,
                        help="record every rank's MPI calls and show who waits for whom (%%mpi trace, "
                             "mpinb.trace())")),
]


def cell_arguments(func):
    """*func* with ``%%mpi``'s arguments (:data:`CELL`): its ``parser``, and their help after its docstring."""
    for names, options in reversed(CELL):
        func = magic_arguments.argument(*names, **options)(func)
    return magic_arguments.magic_arguments(name="mpi")(func)


def parse_cell_line(line):
    """The options of a ``%%mpi`` line's arguments (the text after ``%%mpi``); ``UsageError`` when they are wrong."""
    return magic_arguments.parse_argstring(_cell_line, line)


@cell_arguments
def _cell_line(line="", cell=""):
    """Run the cell on every rank of the MPI world."""


def line_parser():
    """``%mpi``'s parser: one subcommand per action."""
    parser = _Parser(prog="%mpi", description="Start, stop and inspect the MPI world.")
    commands = parser.add_subparsers(
        dest="command", metavar="{start,stop,restart,status,run,output,metrics,grads,view,trace,who,stacks,debug,inject}")
    commands.required = True
    _start(commands)
    commands.add_parser("stop", help="stop the world and every process it started")
    restart = commands.add_parser("restart", help="new processes, same size unless -n, with every rank's variables "
                                                  "as of the last cell all finished")
    restart.add_argument("-n", type=count, default=None, help="new number of ranks")
    restart.add_argument("--fresh", action="store_true",
                         help="start with empty namespaces instead of the variables kept")
    commands.add_parser("status", help="rank, host, pid and state of every rank")
    _run(commands)
    commands.add_parser("output", help="the last cell's output, rank by rank")
    metrics = commands.add_parser("metrics", help="charts and per-rank table of what mpinb.report() sent")
    metrics.add_argument("--run", default=None, help="only this run (default: all)")
    grads = commands.add_parser("grads", help="per layer and rank: gradient norms, and where ranks disagree")
    grads.add_argument("model", help="the torch.nn.Module's name on the ranks, e.g. model or trainer.model")
    commands.add_parser("view", help="make the world's ipyparallel view the one %%px runs on (mpinb.view())")
    commands.add_parser("trace", help="the last %%mpi --trace cell's timeline and summary again (mpinb.trace())")
    commands.add_parser("who", help="every name on the ranks, with the names that differ between ranks flagged")
    stacks = commands.add_parser("stacks", help="where each rank is: its main thread's Python and native frames "
                                                "(py-spy), identical stacks merged")
    stacks.add_argument("ranks", nargs="?", default="all", metavar="RANKS",
                        help="the ranks, like 0, 0-3 or 1,3 (default: every rank)")
    _debug(commands)
    _inject(commands)
    return parser


def _start(commands):
    """``%mpi start``: the world's size, its MPI, where the controller listens and where its ranks run."""
    start = commands.add_parser("start", help="start a world of N ranks")
    start.add_argument("-n", type=count, default=None, help="number of ranks (default: MPIMagics.default_ranks)")
    start.add_argument("--mpi", default=None, type=which_mpi,
                       help="which MPI: mpich, openmpi, impi, or an mpiexec's path (default: MPIMagics.default_mpi)")
    start.add_argument("--mpiexec", default=None, help="mpiexec to use; its MPI is read from its --version")
    start.add_argument("--mpiexec-arg", action="append", default=None, help="extra mpiexec argument (repeatable)")
    start.add_argument("--ip", default=None, type=address,
                       help="address the controller listens on (default loopback); ranks on other hosts need one")
    start.add_argument("--launcher", default=None, type=str.lower,
                       help=f"how ranks start: {', '.join(LAUNCHERS)} (default: MPIMagics.launcher, mpi)")
    start.add_argument("--hostfile", default=None, help="hosts file for mpiexec (mpi and ssh launchers)")
    start.add_argument("--partition", "--queue", default=None, help="batch job's partition (queue)")
    start.add_argument("--time", default=None, help="batch job's time limit, e.g. 00:30:00")
    start.add_argument("--account", default=None, help="account the batch job is charged to")
    start.add_argument("--scheduler-arg", action="append", default=None,
                       help="more job-script directives, e.g. --scheduler-arg=--gres=gpu:1 (repeatable)")


def _run(commands):
    """``%mpi run``: a script and its arguments, with what a ``%%mpi`` cell takes of the world and its time."""
    run = commands.add_parser("run", help="run a script on every rank as __main__ with sys.argv = [FILE, *ARGS], as "
                                          "mpiexec python FILE ARGS would; its globals stay for the next cell")
    run.add_argument("-n", type=count, default=None,
                     help="number of ranks; starts a world of that size if none is running")
    run.add_argument("--timeout", type=float, default=None, metavar="S",
                     help="stop the script after S seconds, showing where every rank still running is")
    run.add_argument("--trace", action="store_true", default=False,
                     help="record every rank's MPI calls and show who waits for whom")
    run.add_argument("file", metavar="FILE", nargs="?", default=None,
                     help="the script, relative to the notebook's directory (ranks on other hosts read their own "
                          "copy at the same absolute path)")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                     help="the script's arguments, passed as they are (options after FILE are the script's)")


def _debug(commands):
    """``%mpi debug``: pdb in a rank's failed cell, here or in JupyterLab's debugger panel, and the panel's rank."""
    debug = commands.add_parser("debug", help="pdb in rank R's last failed cell, its prompt here; --panel: in "
                                              "JupyterLab's debugger panel; --rank R: the rank the panel shows")
    debug.add_argument("rank", type=int, nargs="?", default=None, help="the rank whose last failed cell to debug")
    debug.add_argument("--panel", action="store_true",
                       help="show the failed cell's frames in JupyterLab's debugger panel (switched on) instead")
    debug.add_argument("--rank", dest="panel_rank", type=int, default=None, metavar="R",
                       help="the rank JupyterLab's debugger panel shows when ranks stop at breakpoints (default 0)")


def _inject(commands):
    """``%mpi inject``: a fault of :data:`~mpinb.rank.faults.KINDS` on a rank, where it acts and how hard."""
    inject = commands.add_parser(
        "inject", help=f"plant a fault on rank R, acted on at its collectives (for teaching): "
                       f"{', '.join(faults.KINDS)}; clear removes every fault; alone, lists them")
    inject.add_argument("kind", nargs="?", default=None, choices=[*faults.KINDS, "clear"], metavar="KIND",
                        help=f"{', '.join(faults.KINDS)}, or clear")
    inject.add_argument("--rank", type=int, default=None, metavar="R", help="the rank it is planted on")
    inject.add_argument("--at", type=collective, default=1, metavar="N",
                        help="the rank's collective, counted from now (1: the next one), it acts at (from: "
                             "straggler, perturb)")
    inject.add_argument("--delay", type=delay, default=0.1, metavar="S",
                        help=f"straggler: seconds of sleep before each collective, 0 to {faults.MAX_DELAY:g} "
                             "(default 0.1)")
    inject.add_argument("--scale", type=scale, default=1e-3, metavar="X",
                        help="perturb: the noise's standard deviation, >= 0 (default 0.001)")
