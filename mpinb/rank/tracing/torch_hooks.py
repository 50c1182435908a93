"""mpinb's hooks into PyTorch, put in place the moment each module they change is imported (never importing torch
itself): ``torch.distributed``'s collectives (``trace_torch.py``) and its ``"mpi4py"`` backend (``torch_backend``), DistributedDataParallel's gradient buckets
(``trace_ddp.py``), ``DistributedSampler``'s epochs (``sampler_epochs.py``)."""

from .. import sampler_epochs, torch_backend
from ..on_import import when_imported
from . import trace_ddp, trace_torch


def install_when_imported():
    """Each hook now if its module is imported, else the moment it is (idempotent)."""
    when_imported("torch.distributed", _distributed)
    when_imported("torch.nn.parallel.distributed", trace_ddp.install)
    when_imported("torch.utils.data.distributed", sampler_epochs.install)


def _distributed(dist):
    trace_torch.install(dist)
    torch_backend.register()
