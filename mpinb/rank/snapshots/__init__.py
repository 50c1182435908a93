"""Each rank's variables kept on its own host after every cell it finished, so that a world started again (a
process died, ``%mpi restart``, mpinb's own restarts) gets them back.

After a cell ends well, a thread of the rank pickles its namespace in one pass (cloudpickle, so that functions
and classes defined in cells travel by value; shared objects stay shared: an optimizer still holds the model's
own parameters) with the bytes of arrays and tensors out of band. Each such buffer is stored once under its
content hash, so a value that did not change is not written again; the rest (the object graph, small) is written
per cell, with what could not be kept and why, and the global random generators' state. Functions of cells come back bound to
the rank's namespace, and the world's own objects (``comm``) by reference, as the new world's. The next cell waits for the snapshot (at most as long as writing
what changed takes): a snapshot is never of a namespace a cell is changing. Files live in a private directory
of the world's (``$MPINB_SNAPSHOT_DIR``), made on the rank's host, one folder per rank; the notebook removes it
when the world is stopped, and keeps it when a world that died is started again.

Its parts: taking one (``taking.py``), what a namespace pickles to and from (``pickling.py``), a restore
(``restoring.py``).
"""

from .restoring import available, changes_namespace, restore
from .taking import Snapshots, current, flush, install

__all__ = ["Snapshots", "available", "changes_namespace", "current", "flush", "install", "restore"]
