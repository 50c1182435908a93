"""How a rank's namespace is pickled for its snapshot, and unpickled by a restore: cloudpickle, with tensors' bytes
out of band, the world's own objects by reference, functions of cells bound to the namespace they are loaded
into, what belongs to the world that died refused with the reason, and the global random generators' state."""

import contextlib
import pickle
import sys


# names a world defines itself on every rank, made again by the next one
WORLD_NAMES = {"comm", "rank", "size", "MPI", "mpi_rank", "mpi_size", "In", "Out", "get_ipython", "exit", "quit",
               "open",
               "_ih", "_oh", "_dh", "_", "__", "___", "_i", "_ii", "_iii", "_mpinb_cell_value"}


def hidden(name):
    """Whether *name* is one the world or IPython defines, not the user's: never kept."""
    return name in WORLD_NAMES or name.startswith("__") or (name.startswith("_i") and name[2:].isdigit()) or \
        (name.startswith("_") and name[1:].isdigit())


def tensor(data, dtype, shape, requires_grad, parameter):
    """A CPU tensor rebuilt from its bytes, which travelled out of band (a ``PickleBuffer``)."""
    import torch

    flat = torch.frombuffer(bytearray(data) if isinstance(data, (bytes, memoryview)) else data, dtype=torch.uint8)
    value = flat.view(getattr(torch, dtype)).reshape(shape) if flat.numel() else \
        torch.empty(shape, dtype=getattr(torch, dtype))
    if parameter:
        return torch.nn.Parameter(value, requires_grad=requires_grad)
    return value.requires_grad_(requires_grad) if requires_grad else value


def pickler_class():
    """The snapshot's pickler (a class made on first use: cloudpickle is imported then)."""
    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        """cloudpickle, with CPU tensors' bytes out of band (torch pickles them in band, through a copy), the
        world's own objects (``comm``, ``MPI.COMM_WORLD``) by reference, and the functions and classes of cells
        bound to the namespace they are loaded into, as if defined there."""

        check = staticmethod(lambda: None)  # raises Cancelled when a cell arrived
        namespace = None  # the rank's namespace: its functions' globals travel as a reference to it
        world = {}  # id of an object of the world's -> its name (bound to the new world's at load)

        def reducer_override(self, obj):
            self.check()
            name = self.world.get(id(obj))
            if name is not None:
                return world_object, (name,)
            if obj.__class__ is LiveNamespace:
                return live_namespace, ()
            refused = made_anew(obj)
            if refused is not None:
                raise pickle.PicklingError(refused)
            torch = torch_module()
            if torch is not None and isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor,
                                                                                      torch.nn.Parameter) \
                    and obj.device.type == "cpu" and obj.layout == torch.strided and not obj.is_quantized:
                data = obj.detach().contiguous()
                raw = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else b""
                return tensor, (pickle.PickleBuffer(raw), str(data.dtype).removeprefix("torch."),
                                 tuple(data.shape), obj.requires_grad, type(obj) is torch.nn.Parameter)
            return super().reducer_override(obj)

        def _dynamic_function_reduce(self, func):
            reduced = super()._dynamic_function_reduce(func)
            if self.namespace is None or func.__globals__ is not self.namespace:
                return reduced
            # a function of a cell reads the rank's live namespace once restored (a name rebound later is what it
            # then sees), not a copy of the globals it used: those come back as the snapshot's values, the
            # world's names (comm, rank, size) as the new world's
            make, (code, _, *rest), (state, slots), *tail = reduced
            # (a communicator or process group it reads as a global is not kept, and is listed under its own name)
            slots["__globals__"] = {key: value for key, value in slots["__globals__"].items()
                                    if not hidden(key) and made_anew(value) is None}
            return (make, (code, LIVE, *rest), (state, slots), *tail)

    return Pickler


class LiveNamespace:
    """Stands for the rank's namespace in a snapshot: the globals of the functions defined in cells."""


LIVE = LiveNamespace()
_loading_into = None  # the namespace a restore is loading into


@contextlib.contextmanager
def loading(namespace):
    """Unpickle a snapshot into *namespace*: its functions' globals, and the world's names, are that namespace's."""
    global _loading_into
    builtins = namespace.get("__builtins__")
    _loading_into = namespace
    try:
        yield
    finally:
        _loading_into = None
        if builtins is not None:  # a function's restore sets its globals' __builtins__ to the builtins' dict
            namespace["__builtins__"] = builtins


def live_namespace():
    return _loading_into


def world_object(name):
    """The new world's object for *name*: an MPI predefined communicator, or a name the world defines."""
    if name.startswith("MPI."):
        from mpi4py import MPI

        return getattr(MPI, name.removeprefix("MPI."))
    return _loading_into[name]


def world_objects(namespace):
    """``{id: name}`` of the objects a world makes itself, which a snapshot keeps by reference."""
    objects = {}
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        for name in ("COMM_WORLD", "COMM_SELF", "COMM_NULL"):
            objects[id(getattr(mpi, name))] = f"MPI.{name}"
    if "comm" in namespace and id(namespace["comm"]) not in objects:
        objects[id(namespace["comm"])] = "comm"
    return objects


RANDOM_STATE = "random"  # the manifest's key for the global random generators' state


def random_state():
    """The state of the global random generators this rank has imported: Python's ``random``, numpy's global
    generator, torch's CPU generator and every CUDA device's (once CUDA is initialised)."""
    import random

    state = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    torch = torch_module()
    if torch is not None:
        state["torch"] = torch.get_rng_state().numpy().tobytes()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = [generator.numpy().tobytes() for generator in torch.cuda.get_rng_state_all()]
    return state


def set_random_state(state):
    """Put back what :func:`random_state` saved (importing numpy and torch where it holds their state)."""
    import random

    random.setstate(state["random"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
        if "cuda" in state and torch.cuda.is_available():
            devices = torch.cuda.device_count()
            torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                                          for raw in state["cuda"][:devices]])


# what a fresh world makes anew rather than restores: it belongs to the world that died (pickled, a DDP
# wrapper would come back without its process group, and fail the whole restore)
MADE_ANEW = {
    "DistributedDataParallel": "a DDP wrapper: run the cell that wrapped the model again (the model under it "
                               "is kept where a name holds it)",
    "ProcessGroup": "a process group: run the cell that made it again (mpinb.torch.init_process_group())",
    **dict.fromkeys(("Intracomm", "Intercomm", "Cartcomm", "Graphcomm", "Distgraphcomm", "Topocomm"),
                    "a communicator made in a cell (comm.Split, comm.Dup, Create_cart...) of the world that died: "
                    "run the cell that made it again"),
    "Request": "an MPI request of the world that died", "Win": "an MPI window of the world that died",
    "File": "an MPI file of the world that died",
}


def made_anew(obj):
    for kind in type(obj).__mro__:  # mpinb's traced communicators are subclasses of mpi4py's
        why = MADE_ANEW.get(kind.__name__)
        if why is not None and kind.__module__.startswith(("torch", "mpi4py")):
            return why
    return None


def torch_module():
    import sys

    return sys.modules.get("torch")


def why_not_kept(value, exc):
    if isinstance(exc, pickle.PicklingError) and str(exc) in MADE_ANEW.values():
        return str(exc) if made_anew(value) else f"it holds {exc}"
    kind = type(value).__name__
    return f"a {kind} does not pickle ({type(exc).__name__}: {str(exc)[:120]})"
