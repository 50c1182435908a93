"""PyTorch's own distributed tests (``torch/testing/_internal/distributed/distributed_test.py``, the suite torch runs
for gloo, nccl and mpi) on the ``"mpi4py"`` backend, under ``mpiexec``: every rank runs the same tests in the same
order, in this process (torch's harness would spawn processes, which MPI does not count as ranks).

    mpiexec -n 2 python tests/torch_suite.py [--as mpi|gloo] [PATTERN ...] [!PATTERN ...]

``--as mpi`` (or ``gloo``) runs the tests as torch runs them for its own MPI backend (or for gloo): the suite decides
at import which tests a backend runs and what some of them expect by the backend's name, and these are the two
CPU backends it knows; the group is this backend's either way. ``!PATTERN`` leaves tests out: as gloo,
``'!*timeout*'`` (the backend has no timeouts: MPI's calls wait, and mpinb's roll call names the rank that does).

Prints one line per test (``PASS``, ``SKIP reason``, ``FAIL message``) on rank 0 and a summary; exits 1 if any
failed. A test counts as passed only where it passed on every rank.
"""

import fnmatch
import os
import random
import sys
import tempfile
import traceback
import unittest

from mpi4py import MPI

comm = MPI.COMM_WORLD
AS = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--as" else "mpi4py"
PATTERNS = sys.argv[3:] if AS != "mpi4py" else sys.argv[1:]
os.environ.update(BACKEND=AS, WORLD_SIZE=str(comm.size), RANK=str(comm.rank), MASTER_ADDR="127.0.0.1")
temp = comm.bcast(tempfile.mkdtemp(prefix="torch-suite-") if comm.rank == 0 else None)
os.environ["TEMP_DIR"] = temp
if comm.rank == 0:
    for sub in ("barrier", "test_dir", "init_dir"):
        os.makedirs(os.path.join(temp, sub), exist_ok=True)
comm.Barrier()
port = comm.bcast(__import__("socket").create_server(("127.0.0.1", 0)).getsockname()[1] if comm.rank == 0 else None)
os.environ["MASTER_PORT"] = str(port)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal import common_distributed  # noqa: E402

import mpinb.rank.torch_backend as backend  # noqa: E402

backend.register()
for feature in ("ddp", "subgroup", "plugin"):  # what this backend implements, as torch's lists say of gloo
    common_distributed.DistTestCases.backend_feature[feature].add(AS)
common_distributed.DistTestCases.skip_collective["allgather_coalesced"].discard(AS)

from torch.testing._internal.distributed import distributed_test as suite  # noqa: E402


class Suite(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
    """torch's tests, each run in this process on every rank."""

    def _barrier(self, *args, **kwargs):
        comm.Barrier()


def run(name):
    """``("PASS" | "SKIP" | "FAIL", text)`` of test *name* on this rank."""
    case = Suite(name)
    case.rank = comm.rank
    case.file_name = os.path.join(temp, "init_dir", "file")
    outcome = unittest.TestResult()
    torch.manual_seed(0)  # as torch's TestCase.setUp seeds every test (the rest of its set-up is for spawning)
    random.seed(0)
    try:
        case.setUp = lambda: None
        case.tearDown = lambda: None
        case.run(outcome)
    except SystemExit as exit:  # torch's skips exit the process with a code of theirs
        skip = next((s for s in common_distributed.TEST_SKIPS.values() if s.exit_code == exit.code), None)
        return ("SKIP", skip.message if skip else f"exit {exit.code}") if exit.code else ("PASS", "")
    except BaseException as exc:  # noqa: BLE001 - reported
        return "FAIL", "".join(traceback.format_exception_only(exc)).strip()
    if outcome.skipped:
        return "SKIP", outcome.skipped[0][1]
    if outcome.errors or outcome.failures:
        text = [line for line in (outcome.errors + outcome.failures)[0][1].strip().splitlines()
                if line.strip() and "PYTORCH_PRINT_REPRO_ON_FAILURE" not in line and not line.startswith("To execute")]
        last = next((line for line in reversed(text) if not line.startswith(" ")), "?")
        if last.startswith("SystemExit: "):  # torch's skips exit the process with a code of theirs
            code = int(last.split()[-1])
            skip = next((s for s in common_distributed.TEST_SKIPS.values() if s.exit_code == code), None)
            return "SKIP", skip.message if skip else last
        return "FAIL", last
    return "PASS", ""


def main(patterns):
    wanted = [pattern for pattern in patterns if not pattern.startswith("!")] or ["test_*"]
    unwanted = [pattern[1:] for pattern in patterns if pattern.startswith("!")]
    names = sorted(name for name in dir(Suite) if name.startswith("test_")
                   and any(fnmatch.fnmatch(name, pattern) for pattern in wanted)
                   and not any(fnmatch.fnmatch(name, pattern) for pattern in unwanted))
    dist.init_process_group("mpi4py", init_method="env://", world_size=comm.size, rank=comm.rank)
    counts = {"PASS": 0, "SKIP": 0, "FAIL": 0}
    for name in names:
        verdicts = comm.gather(run(name))
        comm.Barrier()
        if comm.rank == 0:
            kinds = {kind for kind, _ in verdicts}
            kind = "FAIL" if "FAIL" in kinds else "SKIP" if "SKIP" in kinds else "PASS"
            counts[kind] += 1
            text = next((text for k, text in verdicts if k == kind), "")
            print(f"{kind} {name} {text[:300]}", flush=True)
    if comm.rank == 0:
        print(f"{counts['PASS']} passed, {counts['SKIP']} skipped, {counts['FAIL']} failed on {comm.size} ranks "
              f"(as {AS})",
              flush=True)
    dist.destroy_process_group()
    return counts["FAIL"]


if __name__ == "__main__":
    if comm.bcast(main(PATTERNS)):
        sys.exit(1)
