"""DistributedDataParallel's gradient allreduce in the rank's ledger, through DDP's own communication hook.

DDP reduces gradients from C++ (its Reducer calls the process group), out of sight of the wrapped
``torch.distributed`` functions. Its one sanctioned place for Python to see each bucket is the communication hook
(``register_comm_hook``): every DDP model gets :class:`Buckets` as its hook when it is made. Unless the user
registers a hook of their own, it does what torch's ``allreduce_hook`` does (divide by the group's size, launch
an asynchronous ``all_reduce``), noting the bucket in the group's ledger as ``DDP all_reduce`` with its element
count and type; a user's hook (or a built-in one) is run by it instead, and the collectives that hook calls are
noted by the wrapped functions. So a rank waiting at the end of ``backward()`` for a bucket another rank never
sends is seen by the roll call, like an mpi4py collective.

The cost is a Python call per bucket per step (a few per step for most models) where torch would call its C++
hook. ``join()`` runs the same hook for the ranks that joined, so their stand-in buckets are counted too.
"""

import functools
import re
import weakref

from . import replicas, trace_torch, tracing

OP = "DDP all_reduce"
_state = tracing.state
_done = False
models = weakref.WeakSet()  # the DDP models made on this rank, to name their parameters in DDP's errors


def install(module):
    """Give every DDP model of *module* (``torch.nn.parallel.distributed``) made from now on a :class:`Buckets`
    hook (idempotent)."""
    global _done
    if _done or not trace_torch.original:  # torch.distributed is not wrapped (not available): nothing to note
        return
    _done = True
    ddp = module.DistributedDataParallel
    made, register, builtin = ddp.__init__, ddp.register_comm_hook, ddp._register_builtin_comm_hook

    @functools.wraps(made)
    def __init__(self, *args, **kwargs):
        made(self, *args, **kwargs)
        models.add(self)
        replicas.watch(self)
        reducer = getattr(self, "reducer", None)
        if reducer is None or getattr(self, "_comm_hooks", None):
            return
        import torch.distributed as dist

        hook = Buckets(self.process_group)
        dist._register_comm_hook(reducer, None, hook)  # not through register_comm_hook: the user still may
        self._mpinb_buckets = hook

    @functools.wraps(register)
    def register_comm_hook(self, state, hook):
        buckets = getattr(self, "_mpinb_buckets", None)
        if buckets is None:
            return register(self, state, hook)
        if buckets.hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once")
        self._check_comm_hook(hook)
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks.append((hook, state))
        buckets.hook, buckets.state = hook, state
        return None

    @functools.wraps(builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):
        buckets = getattr(self, "_mpinb_buckets", None)
        if buckets is None:
            return builtin(self, comm_hook_type)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = {"ALLREDUCE": default_hooks.allreduce_hook, "FP16_COMPRESS": default_hooks.fp16_compress_hook}
        hook = hooks.get(getattr(comm_hook_type, "name", str(comm_hook_type)).rsplit(".", 1)[-1])
        if hook is None:
            raise ValueError(f"unknown built-in communication hook {comm_hook_type}")
        if buckets.hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once")
        self.logger._set_comm_hook_name(str(comm_hook_type))
        buckets.hook, buckets.state = hook, self.process_group
        return None

    ddp.__init__ = __init__
    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = _register_builtin_comm_hook


class Buckets:
    """The communication hook of a DDP model: each gradient bucket averaged by an asynchronous ``all_reduce``
    noted in the ledger, or handed to the hook the user registered."""

    def __init__(self, group):
        self.group = group
        self.hook = self.state = None

    def __call__(self, _, bucket):
        if self.hook is not None:
            return self.hook(self.state, bucket)
        import torch.distributed as dist

        group = self.group if self.group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())  # before the sum, as torch's allreduce_hook (no overflow in 16 bits)
        info, seq, signature, start = trace_torch.note(dist, group, OP, None, tensor.numel(),
                                                       str(tensor.dtype).replace("torch.", ""))
        work = trace_torch.original["all_reduce"](tensor, group=group, async_op=True)
        _state.launched(info, seq, signature, start, work)
        future = work.get_future()
        if _state.spans is not None:
            future = future.then(functools.partial(_traced, info.name, tensor, start, seq))
        return future.then(_first)


def _first(future):
    return future.value()[0]


def _traced(group, tensor, start, seq, future):
    """Once a bucket's all_reduce completed, while traced: its span, from launch to completion."""
    end = tracing.now_ns()
    size = tensor.numel() * tensor.element_size()
    if _state.spans is not None:
        _state.spans.append((OP, group, None, size, 0, start, end, seq, "torch",
                             f"{tensor.numel()} x {str(tensor.dtype).replace('torch.', '')}"))
        _state.recorded += 1
    return future.value()


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
