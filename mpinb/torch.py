"""Data-parallel PyTorch on an MPI world, the Horovod way and the ``DistributedDataParallel`` way.

Runs on ranks (under ``%%mpi`` or plain ``mpiexec python train.py``); imports no IPython::

    import mpinb.torch as mt
    mt.init_process_group()                      # torch.distributed from MPI: mpi4py on CPU, nccl with a GPU each
    mt.torchrun_environment()                    # or torchrun's MASTER_ADDR, RANK, ... (every %%mpi world has them)
    mt.broadcast_parameters(model)               # every rank starts from rank 0's weights (a model or state_dict)
    loss.backward()
    mt.allreduce_gradients(model)                # average gradients: fused buckets, buffer-based MPI
    opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, overlap=True)
    mt.broadcast_optimizer_state(opt)            # every rank resumes from rank 0's optimizer state
"""

try:
    import torch  # noqa: F401 - what every name here works on
except ImportError as missing:
    raise ImportError("mpinb.torch needs PyTorch, which is not installed here: pip install 'mpinb[torch]' (on "
                      "every host the ranks run on), or PyTorch's CPU build: pip install torch --index-url "
                      "https://download.pytorch.org/whl/cpu") from missing

from .rank.data_parallel import (
                                 DistributedOptimizer,
                                 GradientAllreducer,
                                 allreduce_gradients,
                                 broadcast_optimizer_state,
                                 broadcast_parameters,
)
from .rank.process_group import (
                                 choose_backend,
                                 destroy_process_group,
                                 init_process_group,
                                 torchrun_environment,
)

__all__ = ["DistributedOptimizer", "GradientAllreducer", "allreduce_gradients", "broadcast_optimizer_state",
           "broadcast_parameters", "choose_backend", "destroy_process_group", "init_process_group",
           "torchrun_environment"]
