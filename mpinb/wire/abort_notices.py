"""The notice each MPI writes when a rank calls MPI_Abort, read back from the rank's standard error: by the rank
itself (``rank/abort_watch.py``: a rank MPI_Abort let live on is ended) and by the notebook (``notebook/diagnosis/
deaths.py``: who ended the job, and with which code)."""

import re


# What each MPI writes when a rank calls MPI_Abort: MPICH and Intel MPI on the rank's stderr, Open MPI 5 there
# too, Open MPI 4 through mpiexec
_ABORTS = (
    re.compile(r"application called MPI_Abort\((?P<comm>[^,]+), (?P<code>-?\d+)\) - process (?P<rank>\d+)"),
    re.compile(r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator (?P<comm>\S+)\s+"
               r"(?:with errorcode|[\s\S]{0,400}?Errorcode:)\s*(?P<code>-?\d+)"),
)


def aborts(text):
    """``[(rank, communicator, error code)]`` of the MPI_Abort notices in *text*, whichever MPI wrote them."""
    found = []
    for pattern in _ABORTS:
        found += [(int(m["rank"]), m["comm"], int(m["code"])) for m in pattern.finditer(text)]
    return found
