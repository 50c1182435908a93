"""``%mpi who`` on the rank: :func:`who` describes every user name with a short content hash the notebook compares
across ranks. ``describing.py`` hands each value to the module of its kind, which puts it in words and hashes it:
``arrays.py``, ``tensors.py`` (tensors, models, optimizers), ``comms.py``, ``objects.py`` (any other value, through
its pickle); below them the digest and the call's budget (``digests.py``) and shared words (``text.py``)."""

from .describing import describe, who

__all__ = ["describe", "who"]
