"""DistributedDataParallel's gradient allreduce in the rank's ledger: one entry per training step.

DDP reduces gradients from C++ (its Reducer calls the process group as each bucket's gradients are ready), out of
sight of the wrapped ``torch.distributed`` functions. What Python does see is the forward pass that sets the
Reducer up for the backward (``_pre_forward``), and the backward reaching the model's output, before any of its
gradients (a hook on the output). Per step that will reduce (grad enabled, not inside ``no_sync()``), every DDP
model notes there one collective ``DDP all_reduce(<gradient elements> x <dtype>)`` in the group's ledger,
outstanding until that backward ends, and holds Stop until then (``stop_held.py``): a rank is either before the
step's reduction or through all of it. A rank waiting at the end of ``backward()`` for buckets another rank never
sends is then seen by the roll call like an mpi4py collective, and a rank that never entered it (it ran out of
inputs, or was stopped between its forward and its backward) can stand in for it as DDP's ``join()`` does
(``shadow``): it reduces zeros for every bucket, in the Reducer's bucket order, so the waiting rank's backward
completes.

DDP's own C++ allreduce is left as it is: a communication hook per bucket cost a small model's step 12%, mostly
because with any hook DDP no longer divides the gradients as it copies them into the bucket (the hook needs a
pass of its own), then in taking the GIL for each bucket's callback and in ``dist.all_reduce``'s Python checks.
The cost here is a Python call per forward and one per backward. The hooks a user registers
(``register_comm_hook``) run as torch runs them.
"""

import functools
import re
import weakref

from .. import replicas, tracing
from . import trace_torch
from .stop_held import Hold

OP = "DDP all_reduce"
_state = tracing.state
_done = False
models = weakref.WeakSet()  # the DDP models made on this rank, to name their parameters in DDP's errors
_steps = weakref.WeakKeyDictionary()  # DDP model -> [count, dtype, its step's outstanding entry or None, ledger]
_original_match = []  # DDP's own _match_all_reduce_for_bwd_pass, which shadow() calls (it counts the step itself)


def install(module):
    """Note every step of the DDP models of *module* (``torch.nn.parallel.distributed``) made from now on in the
    ledger, and a joined rank's stand-in steps (idempotent)."""
    global _done
    if _done or not trace_torch.original:  # torch.distributed is not wrapped (not available): nothing to note
        return
    _done = True
    ddp = module.DistributedDataParallel
    made = ddp.__init__

    @functools.wraps(made)
    def __init__(self, *args, **kwargs):
        made(self, *args, **kwargs)
        _watch(self)

    before = ddp._pre_forward

    @functools.wraps(before)
    def _pre_forward(self, *inputs, **kwargs):
        # after DDP's own forward-side collectives (join's notices, buffer broadcasts): where a joined rank's
        # stand-in step comes too
        done = before(self, *inputs, **kwargs)
        _forward(self)
        return done

    after = ddp._post_forward

    @functools.wraps(after)
    def _post_forward(self, output):
        output = after(self, output)
        _until_backward_ends(self, output)
        return output

    match = ddp._match_all_reduce_for_bwd_pass

    @functools.wraps(match)
    def _match_all_reduce_for_bwd_pass(self):  # a joined rank's stand-in step under join(): counted as a step
        step = _steps.get(self)
        if step is not None:
            import torch.distributed as dist

            trace_torch.note(dist, self.process_group, OP, None, step[0], step[1], name=step[3])
        return match(self)

    ddp.__init__ = __init__
    ddp._pre_forward = _pre_forward
    ddp._post_forward = _post_forward
    ddp._match_all_reduce_for_bwd_pass = _match_all_reduce_for_bwd_pass
    _original_match.append(match)


def _watch(model):
    """A DDP *model* just made: among the models, its replicas watched, and what its steps are noted as (their
    gradients' size and dtype, and its group's ledger)."""
    models.add(model)
    replicas.watch(model)
    if getattr(model, "reducer", None) is None:
        return
    grads = [parameter for parameter in model.parameters() if parameter.requires_grad]
    dtypes = {parameter.dtype for parameter in grads}
    dtype = str(next(iter(dtypes))).replace("torch.", "") if len(dtypes) == 1 else None
    import torch.distributed as dist

    # its ledger, named now: a rank that destroys its default group after its last step still stands in for this
    # model's steps on the group it has kept (the name torch gives it then is no longer "default")
    _steps[model] = [sum(parameter.numel() for parameter in grads), dtype, None,
                     trace_torch.group_name(dist, model.process_group)]


class Step:
    """A DDP step's reduction as the ledger sees it: noted when its backward begins, outstanding until it is
    ``done``, with Stop held meanwhile (``hold``)."""

    __slots__ = ("done", "noted", "hold")

    def __init__(self):
        self.done, self.noted, self.hold = False, False, None

    def is_completed(self):
        return self.done


def _forward(model):
    """A DDP model's forward set its Reducer up: the step it starts will reduce its gradients once its backward
    begins (:func:`_until_backward_ends`)."""
    import torch

    step = _steps.get(model)
    if step is None:
        return
    previous = step[2]
    step[2] = None
    if previous is not None:
        previous.done = True  # the previous step's backward is over: this forward comes after it
    if torch.is_grad_enabled() and model.require_backward_grad_sync:  # else no reduction follows (no_sync())
        step[2] = Step()
    if previous is not None and previous.hold is not None:  # its backward raised before it ended: Stop is let
        previous.hold.release()  # through again, and one held meanwhile raised here


def _until_backward_ends(model, output):
    """Note the step when the backward of *output* begins, hold Stop until that backward ends (reducing every
    bucket: ``stop_held.py``), and keep the step outstanding until then. A rank stopped between its forward and
    its backward has not entered the step, so a rank waiting in it is let out by this one standing in for it."""
    import torch

    step = _steps.get(model)
    pending = step[2] if step is not None else None
    if pending is None:
        return
    tensors = [output] if isinstance(output, torch.Tensor) else \
        [item for item in (output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple))
                            else ()) if isinstance(item, torch.Tensor)]
    tensor = next((item for item in tensors if item.requires_grad), None)
    if tensor is None:  # no output to see its backward begin by: noted now
        _note(model, step, pending)
        return

    queue = torch.autograd.Variable._execution_engine.queue_callback

    def started(grad):  # the backward reached the model's output, before any of its gradients: no bucket is
        # reduced yet. Marked done once that backward ends, after DDP's own final callback (queued later than this
        # hook runs), which waits for the buckets
        if not pending.noted:
            pending.hold = Hold.here()
            _note(model, step, pending)
            queue(lambda: queue(functools.partial(_ended, pending)))
        return grad

    tensor.register_hook(started)


def _note(model, step, pending):
    import torch.distributed as dist

    info, seq, signature, start = trace_torch.note(dist, model.process_group, OP, None, step[0], step[1],
                                                   name=step[3])
    pending.noted = True
    _state.launched(info, seq, signature, start, pending)


def _ended(pending):
    """The step's backward is over: done, and a Stop held meanwhile raised."""
    pending.done = True
    hold, pending.hold = pending.hold, None
    if hold is not None:
        hold.release()


def shadow(name, signature):
    """Stand in for the DDP step (*signature*, on the group of ledger *name*) that the other ranks wait in: count
    it, then reduce zeros for each of its model's buckets, in order, as DDP's ``join()`` does for a rank that ran
    out of inputs (on the roll-call thread: ``rank/settle.py``)."""
    import torch.distributed as dist

    count = signature[2]
    sized = [(model, step[3]) for model, step in list(_steps.items()) if step[0] == count]
    if not sized:
        raise LookupError(f"no DDP model with {count} gradient elements on this rank")
    candidates = [model for model, ledger in sized if ledger == name]
    if not candidates:
        raise LookupError(f"the DDP model with {count} gradient elements reduces on {sized[-1][1]}, not {name}")
    model = candidates[-1]
    trace_torch.note(dist, model.process_group, OP, None, count, signature[3], name=name)
    _original_match[0](model)
    if model.find_unused_parameters:
        model._match_unused_params_allreduce()


UNUSED = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


def explain(exc, text):
    """*text* (the message of *exc*, a rank's error) said plainly where it is DDP's error about parameters that
    got no gradient: which parameters, on which rank, and the fix; else *text* itself."""
    raised_in = []  # the DDP model whose forward raised it
    tb = exc.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if candidate is not None and any(candidate is model for model in models):
            raised_in = [candidate]
        tb = tb.tb_next
    found = unused_parameters(text, raised_in)
    if found is None:
        return text
    rank, names = found
    first = text.split(". ", 1)[0].strip()
    return (f"parameters {', '.join(names)} of the DDP model got no gradient on rank {rank} in the last step (a "
            "rank-dependent branch, or an output left out of the loss), so DDP could not finish reducing: every "
            "rank must use every parameter in each step, or pass find_unused_parameters=True to "
            f"DistributedDataParallel (torch: {first})")


def unused_parameters(text, models):
    """Names for the parameter indices DDP's "Expected to have finished reduction" error gives (*text*), from
    the DDP models in *models*: ``(rank, [name, ...])`` or ``None``."""
    found = UNUSED.search(text)
    if found is None:
        return None
    indices = [int(index) for index in found.group(2).split()]
    for model in models:
        names = reducer_names(model)
        if names and max(indices) < len(names):
            return int(found.group(1)), [names[index] for index in indices]
    return None


def reducer_names(model):
    """The names of a DDP model's parameters in the order its Reducer numbers them (``requires_grad`` ones,
    module by module, the ignored ones left out, each parameter once)."""
    ignored = getattr(model, "parameters_to_ignore", set())
    names, seen = [], set()
    for module_name, module in model.module.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if parameter.requires_grad and full not in ignored and id(parameter) not in seen:
                seen.add(id(parameter))
                names.append(full)
    return names
