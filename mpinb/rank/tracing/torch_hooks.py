"""mpinb's hooks into PyTorch, put in place the moment each module they change is imported (never importing torch
itself): ``torch.distributed``'s collectives (``trace_torch.py``) and its ``"mpi4py"`` backend (``torch_backend``), DistributedDataParallel's gradient buckets
(``trace_ddp.py``), ``DistributedSampler``'s epochs (``sampler_epochs.py``)."""

import importlib.abc
import importlib.util
import sys

from .. import sampler_epochs, torch_backend
from . import trace_ddp, trace_torch


def install_when_imported():
    """Each hook now if its module is imported, else the moment it is (idempotent)."""
    when_imported("torch.distributed", _distributed)
    when_imported("torch.nn.parallel.distributed", trace_ddp.install)
    when_imported("torch.utils.data.distributed", sampler_epochs.install)


def _distributed(dist):
    trace_torch.install(dist)
    torch_backend.register()


def when_imported(name, then):
    """``then(module)`` now if module *name* is imported, else the moment it is."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    elif not any(isinstance(finder, _Finder) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, then))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lets the other finders find module *name*, then calls *then* with it once loaded."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            execute, then = spec.loader.exec_module, self.then

            def exec_module(module):
                execute(module)
                then(module)

            spec.loader.exec_module = exec_module
        return spec
