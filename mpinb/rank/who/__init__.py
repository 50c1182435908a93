"""``%mpi who`` on the rank: :func:`who` describes every user name with a short content hash the notebook compares
across ranks. What a value is described as is in ``describing.py``, its hash in ``hashing.py`` (``pickling.py``
for any value that is not an array, tensor, model or communicator), its words in ``text.py``."""

from .describing import describe, who

__all__ = ["describe", "who"]
