"""The check every collective of the process group makes before its data moves: one ``Allgather`` of 4 numbers
(the call, its root, its count, its dtype and op) that every rank makes the same call. MPICH ends the job when
ranks pass different sizes to one collective ("message truncated"), and a different call waits for ever; instead
every rank raises ``RuntimeError`` naming what each rank called, and the group stays usable."""

import numpy
import torch
import torch.distributed as dist

checked = True  # every collective checks that the ranks agree first (agree)

CALLS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter",
         "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "barrier")
_CALL_CODES = {name: index + 1 for index, name in enumerate(CALLS)}
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_DTYPE_CODES = {dtype: index + 1 for index, dtype in enumerate(_DTYPES)}
_OP_NAMES = {int(op.value) + 1: name for name, op in torch.distributed.ReduceOp.RedOpType.__members__.items()}


def agree(group, call, tensor=None, *, root=-1, op=None, count=None):
    """Check that every rank of *group* (an ``MPIProcessGroup``) makes the same *call* (with *tensor*'s count and
    dtype, *root*, *op*, an integer of ``buffers.op_code``) before its data moves, or raise ``RuntimeError`` on
    every rank. *count* ``-1``: the call's sizes may differ by rank (``all_to_all`` with splits)."""
    if not checked or group.alone:
        return
    if count is None:
        count = tensor.numel() if tensor is not None else 0
    key = (call, root, count, tensor.dtype if tensor is not None else None, op)
    said = group.said.get(key)
    if said is None:
        said = _saying(group, key)
    mine, agreed = said
    every = group.every
    group.comm.Allgather(mine, every)
    if every.tobytes() == agreed:  # the same call on every rank: the bytes of this rank's, once per rank
        return
    _disagreed(group, mine, every)


def _saying(group, key):
    """``(mine, agreed)`` for the call *key*: the 4 numbers this rank sends, and the bytes every rank's make when
    all agree; kept for the calls a training step makes again and again (a few hundred at most)."""
    call, root, count, dtype, op = key
    mine = numpy.array([_CALL_CODES[call], root, count,
                        (_DTYPE_CODES.get(dtype, 99) if dtype is not None else 0) * 16 + (op + 1 if op is not None
                                                                                         else 0)],
                       dtype=numpy.int64)
    if len(group.said) >= 512:
        group.said.clear()
    said = group.said[key] = (mine, mine.tobytes() * group.every.shape[0])
    return said


def _disagreed(group, mine, every):
    """Every rank's call is in *every*: let a rank's stand-in pass, or raise naming what each rank called."""
    stood_in = every[:, 0] == 0  # zeros: a rank that stood in for this call (rank/settle.py), not a call of its
    if stood_in.any() and (stood_in | (every == mine).all(axis=1)).all():
        return
    calls = [_said(row) for row in every.tolist()]
    from ..tracing import trace_torch

    trace_torch.retract(dist, group)  # no rank made the call: the ranks' ledgers agree again
    raise RuntimeError(f"ranks of process group {group.label!r} called different collectives: "
                       + "; ".join(_grouped(calls)) + _why(calls))


def _said(row):
    """A rank's call as its 4 numbers say it: ``all_reduce(4 x float32, SUM)``."""
    call, root, count, code = row
    if call == 0:
        return "nothing (it stood in)"
    dtype, op = divmod(code, 16)
    parts = []
    if root >= 0:
        parts.append(f"root={root}")
    if dtype:
        kind = str(_DTYPES[dtype - 1]).replace("torch.", "") if dtype <= len(_DTYPES) else "another dtype"
        parts.append(f"{count} x {kind}" if count >= 0 else kind)
    if op:
        parts.append(_OP_NAMES.get(op, "?"))
    return f"{CALLS[call - 1]}({', '.join(parts)})"


def _grouped(calls):
    """``rank 0 all_reduce(...); ranks 1-3 all_reduce(...)``."""
    from ...wire.ranks import label_ranks

    by_call = {}
    for rank, call in enumerate(calls):
        by_call.setdefault(call, []).append(rank)
    return [f"{label_ranks(ranks)} in {call}" for call, ranks in by_call.items()]


def _why(calls):
    names = {call.split("(")[0] for call in calls}
    if len(names) > 1:
        return (". Likely the ranks call collectives in a different order (a rank-dependent branch): every rank "
                "must make the same calls in the same order")
    return (". Likely the ranks passed tensors of different sizes or types (pad, or all_gather the sizes first)"
            if len({call for call in calls}) > 1 else "")
