"""The process group's collectives as spans on the timeline of a traced cell (kind ``"collective"``, on
``torch.mpi:<group>``): DDP's gradient buckets, which torch's reducer hands to the group from C++, show one by
one."""

import functools

import torch

from .interrupts import stop_after_backward


def spanned(method, name):
    """*method*, recorded as one span named *name* while a cell is traced, with Stop held until its MPI calls are
    done (:func:`~.interrupts.stop_after_backward`)."""
    from ..tracing import ledger
    from ..tracing.calls import record_span

    state, now = ledger.state, ledger.now_ns

    method = stop_after_backward(method)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if state.spans is None:
            return method(self, *args, **kwargs)
        start = now()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.spans += 1
            first = args[0] if args else None
            tensor = first[0] if isinstance(first, list) and first and isinstance(first[0], torch.Tensor) else \
                first if isinstance(first, torch.Tensor) else None
            size = tensor.numel() * tensor.element_size() if tensor is not None else 0
            detail = f"{tensor.numel()} x {str(tensor.dtype).replace('torch.', '')}" if tensor is not None else ""
            record_span(name, f"torch.mpi:{self.label}", None, size, size, start, now(), self.spans, "collective",
                        detail)

    return call
