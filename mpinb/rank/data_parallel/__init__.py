"""The data-parallel API behind ``mpinb.torch``, Horovod's way: parameters and optimizer state broadcast from one
rank, gradients averaged across ranks. The calls are in ``collectives.py``; what they take, checked on each rank,
in ``arguments.py``, the check that every rank holds the same parameters first in ``agreement.py``, tensors as MPI
buffers in ``flat_buffers.py``, an optimizer's state as it travels in ``optimizer_state.py``."""

from .collectives import (
    DistributedOptimizer,
    GradientAllreducer,
    allreduce_gradients,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["DistributedOptimizer", "GradientAllreducer", "allreduce_gradients", "broadcast_optimizer_state",
           "broadcast_parameters"]
