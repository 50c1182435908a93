"""The ``"mpi4py"`` torch.distributed backend on real worlds: every collective gives gloo's result on the same
inputs, DistributedDataParallel (no_sync, join, find_unused_parameters, static_graph, gradient_as_bucket_view,
the fp16 compression hook) and FSDP train to gloo's weights, under plain mpiexec; and through a %%mpi world."""

import subprocess
import sys
from pathlib import Path

import pytest

from mpinb.notebook.world.mpis import default_mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

HERE = Path(__file__).parent


def test_every_collective_and_ddp_and_fsdp_match_gloo_under_mpiexec():
    done = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, str(HERE / "torch_backend_checks.py")],
                          capture_output=True, text=True, timeout=200)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    failed = [line for line in lines if line.startswith("FAIL ")]
    assert not failed and done.returncode == 0, "\n".join(failed) or done.stderr[-3000:]
    assert len(lines) > 100, done.stdout[-2000:]
