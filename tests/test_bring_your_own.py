"""People's own training code runs in ``%%mpi`` cells as written, through a real kernel on 2 CPU ranks: Lightning's
Fabric and Trainer, Hugging Face Accelerate and Trainer, and the PyTorch DDP tutorial's ``env://`` set-up. Each
trains a tiny model built from code or a config (nothing is downloaded: the kernel runs with ``HF_HUB_OFFLINE=1``
and ``TRANSFORMERS_OFFLINE=1``) for a few steps and ends with the same parameters on every rank, changed from where
they started; reports from a Lightning ``Callback`` and a Hugging Face ``TrainerCallback`` reach
``mpinb.metrics()``; mpinb still names uneven inputs under Fabric and a mismatch under Accelerate, ``%mpi who`` lists
the frameworks' objects, and pdb stops inside Lightning's ``training_step`` and after a failure in a Fabric step.

Checked with lightning 2.6.6, accelerate 1.15.0 and transformers 5.24.0 (the ``frameworks`` extra), on torch 2.13.0
(CPU). None of them needs code of mpinb's: every rank has torchrun's environment, so Lightning picks its
``TorchElasticEnvironment`` (``TORCHELASTIC_RUN_ID`` is set) and Accelerate and ``TrainingArguments`` read
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; and a rank is not a shell (no
``sys.ps1``), so Fabric's ``strategy="ddp"`` does not refuse. Lightning's Trainer runs, but its ``fit`` leaves the
ranks without mpinb's stack-dump signal handler (see :func:`test_a_failure_after_a_lightning_trainer_is_diagnosed`).
"""

import ast
import os
import re
import time

import pytest
from conftest import leftover_ranks, new_world_tag

from kernel_session import jupyter_client_kernel

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook, pytest.mark.timeout(900)]

CELL_TIMEOUT = 400  # a first import of lightning or transformers on every rank of a busy 2-core machine is slow

# the tests' own helper on the ranks, not part of anyone's training code: a hash of a model's parameters' bytes
FINGERPRINT = """%%mpi
import hashlib as _hashlib
import torch as _torch
def fingerprint(module):
    digest = _hashlib.sha256()
    with _torch.no_grad():
        for p in module.parameters():
            digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
"""


def needs(name):
    pytest.importorskip(name, reason=f"{name} is not importable: pip install -e '.[frameworks]'")


@pytest.fixture(scope="module")
def session():
    tag = new_world_tag()
    with jupyter_client_kernel(env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}) as k:
        shown = k.run("%load_ext mpinb\n%mpi start -n 2", timeout=CELL_TIMEOUT)
        assert shown.status == "ok", shown.text
        yield k
        k.run("%mpi stop")
    assert not leftover_ranks(tag)


def run(k, code):
    """Run *code* with the fingerprint helper defined on the ranks (a restart may have removed it)."""
    assert k.run(FINGERPRINT).status == "ok"
    shown = k.run(code, timeout=CELL_TIMEOUT)
    assert shown.status == "ok", shown.text
    assert not shown.internal_frames(), shown.text
    return shown


def lines(shown, label):
    """``{rank: rest of the line}`` for the lines ``[rank R] label ...`` of *shown*."""
    found = dict(re.findall(rf"^\[rank (\d+)\] {re.escape(label)} (.*)$", shown.text, re.M))
    assert sorted(found) == ["0", "1"], shown.text
    return found


def assert_equal_replicas(shown, name):
    """Every rank printed ``{name} start HASH`` and ``{name} end HASH``: the ends are the same on both ranks, and
    each differs from where that rank started (it trained)."""
    start, end = lines(shown, f"{name} start"), lines(shown, f"{name} end")
    assert end["0"] == end["1"], shown.text
    assert all(end[rank] != start[rank] for rank in end), shown.text


def new_metrics(k, code):
    """Run *code* on the ranks and return ``{rank: [steps]}`` of the reports it made, each under the run it went
    to, read in the notebook with ``mpinb.metrics()``."""
    assert k.run("import mpinb\n_runs_before = set(mpinb.metrics().get('run', []))").status == "ok"
    shown = run(k, code)
    metrics = k.run("df = mpinb.metrics()\nfor (_run, _rank), _steps in df[~df.run.isin(_runs_before)]"
                    ".groupby(['run', 'rank']).step:\n    print('metrics', _rank, list(_steps))")
    assert metrics.status == "ok", metrics.text
    found = re.findall(r"^metrics (\d+) (\[.*\])$", metrics.text, re.M)
    return shown, {int(rank): ast.literal_eval(steps) for rank, steps in found}


def fresh_world(k):
    shown = k.run("%mpi restart --fresh", timeout=CELL_TIMEOUT)
    assert shown.status == "ok", shown.text


# --- Lightning Fabric ---------------------------------------------------------------------------------------------

# Lightning reads sys.ps1 once, when it is imported (lightning.fabric.utilities.imports._IS_INTERACTIVE)
REFUSED = """%%mpi
import sys
sys.ps1 = 'In : '
from lightning.fabric import Fabric
try:
    Fabric(accelerator="cpu", devices=2, strategy="ddp")
except RuntimeError as e:
    print("refused", e)
finally:
    del sys.ps1
"""


def test_fabric_refuses_ddp_in_a_shell_which_a_rank_is_not(session):
    """What makes Fabric's ``strategy="ddp"`` run on the ranks: they have no ``sys.ps1`` (IPython's engine set one),
    and with one Lightning refuses, as it does in any interactive shell."""
    needs("lightning")
    shown = session.run("%%mpi\nimport sys\nprint('shell', hasattr(sys, 'ps1'), 'lightning' in sys.modules)")
    assert shown.status == "ok", shown.text
    assert set(lines(shown, "shell").values()) <= {"False False", "False True"}, shown.text
    if "True" in shown.text:  # lightning was imported already (another test ran first): it read sys.ps1 then
        fresh_world(session)
    try:
        refused = session.run(REFUSED, timeout=CELL_TIMEOUT)
        assert refused.status == "ok", refused.text
        said = lines(refused, "refused")
        assert all("is not compatible with an interactive environment" in text for text in said.values()), \
            refused.text
    finally:
        fresh_world(session)  # the ranks' lightning keeps what it read: import it afresh, as a rank that is no shell


# --- PyTorch's DDP tutorial ---------------------------------------------------------------------------------------

DDP_TUTORIAL = """%%mpi
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))

def demo_basic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
    model = ToyModel()
    ddp_model = DDP(model)
    print("tutorial start", fingerprint(model))

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for _ in range(3):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss_fn(outputs, labels).backward()
        optimizer.step()
    print("tutorial end", fingerprint(model))
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")

if __name__ == "__main__":
    demo_basic()
print("group left", dist.is_initialized())
"""


def test_the_pytorch_ddp_tutorial_runs_as_written(session):
    """The tutorial's torchrun version (CPU: gloo, no device ids): ``init_process_group`` with no address reads
    ``env://``, DDP makes rank 0's parameters everyone's, and the group is destroyed at the end."""
    shown = session.run("%%mpi\nimport torch.distributed as dist\nprint('group', dist.is_initialized())")
    if "group True" in shown.text:  # the tutorial starts as a fresh torchrun worker does, with no group
        fresh_world(session)
    shown = run(session, DDP_TUTORIAL)
    assert "[rank 0] Start running basic DDP example on rank 0." in shown.text, shown.text
    assert "[rank 1] Finished running basic DDP example on rank 1." in shown.text
    assert_equal_replicas(shown, "tutorial")
    assert lines(shown, "group left") == {"0": "False", "1": "False"}


# --- Lightning Fabric, again --------------------------------------------------------------------------------------

FABRIC = """%%mpi
import torch
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
print("fabric rank", fabric.global_rank, fabric.world_size, type(fabric.strategy).__name__,
      type(fabric.strategy.cluster_environment).__name__)
fabric.seed_everything(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
print("fabric start", fingerprint(model))
model, optimizer = fabric.setup(model, optimizer)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=4))
for x, y in loader:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    fabric.backward(loss)
    optimizer.step()
print("fabric end", fingerprint(model))
"""


def test_lightning_fabric_trains_with_ddp(session):
    needs("lightning")
    shown = run(session, FABRIC)
    assert lines(shown, "fabric rank") == {"0": "0 2 DDPStrategy TorchElasticEnvironment",
                                      "1": "1 2 DDPStrategy TorchElasticEnvironment"}, shown.text
    assert_equal_replicas(shown, "fabric")


# --- mpinb's diagnosis of framework code --------------------------------------------------------------------------

FABRIC_UNEVEN = """%%mpi
fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
fabric.seed_everything(0)
layer = torch.nn.Linear(4, 1)
model, optimizer = fabric.setup(layer, torch.optim.SGD(layer.parameters(), lr=0.1))
batches = [torch.randn(8, 4) for _ in range(11)][fabric.global_rank::2]
for x in batches:
    optimizer.zero_grad()
    fabric.backward(model(x).pow(2).mean())
    optimizer.step()
"""

FABRIC_STEP = """%%mpi
optimizer.zero_grad()
fabric.backward(model(batches[0]).pow(2).mean())
optimizer.step()
print("step ok", fingerprint(model))
"""


def test_uneven_inputs_under_fabric_are_named_and_the_world_kept(session):
    """6 batches on rank 0 and 5 on rank 1, through Fabric's DDP: named as under plain DDP (tests/test_ddp_bugs.py,
    tutorial 07), and the next step runs with the same weights on both ranks; ``%mpi who`` after it works."""
    needs("lightning")
    assert session.run("%%mpi\nimport torch\nfrom lightning.fabric import Fabric").status == "ok"
    assert session.run(FINGERPRINT).status == "ok"
    shown = session.run(FABRIC_UNEVEN, timeout=CELL_TIMEOUT)
    assert shown.status == "error", shown.text
    assert not shown.internal_frames(), shown.text
    assert re.search(r"rank 0 in DDP all_reduce\(5 x float32\) at cell line \d+", shown.text), shown.text
    assert "rank 1 finished the cell without entering it" in shown.text
    assert "Likely uneven inputs" in shown.text and "model.join()" in shown.text and "drop_last=True" in shown.text
    assert "the world and every rank's variables are kept" in shown.text
    assert "Timed out" not in shown.text
    step = run(session, FABRIC_STEP)
    assert len(set(lines(step, "step ok").values())) == 1, step.text
    who = session.run("%mpi who")
    assert who.status == "ok", who.text
    assert re.search(r"^fabric +all +Fabric ", who.text, re.M), who.text


# --- Hugging Face Accelerate --------------------------------------------------------------------------------------

ACCELERATE = """%%mpi
import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
print("accelerate rank", accelerator.process_index, accelerator.num_processes, accelerator.distributed_type)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
print("accelerate start", fingerprint(model))
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
model, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=4))
for x, y in loader:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
print("gathered", accelerator.gather(torch.tensor([accelerator.process_index + 1.0])).tolist())
print("accelerate end", fingerprint(accelerator.unwrap_model(model)))
"""


def test_accelerate_prepares_trains_and_gathers(session):
    needs("accelerate")
    shown = run(session, ACCELERATE)
    assert lines(shown, "accelerate rank") == {"0": "0 2 DistributedType.MULTI_CPU",
                                          "1": "1 2 DistributedType.MULTI_CPU"}, shown.text
    assert lines(shown, "gathered") == {"0": "[1.0, 2.0]", "1": "[1.0, 2.0]"}
    assert_equal_replicas(shown, "accelerate")


ACCELERATE_MISMATCH = """%%mpi
import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
total = torch.tensor([float(accelerator.process_index + 1)])
if accelerator.process_index == 0:
    summed = accelerator.reduce(total, reduction="sum")
else:
    everyone = accelerator.gather(total)
"""


def test_a_mismatch_under_accelerate_is_named_and_nothing_is_lost(session):
    """Rank 0 reduces while rank 1 gathers, both through Accelerate: named from the ledgers of torch.distributed
    within seconds (gloo would wait 30 minutes), each rank's call at its cell line; two different gloo
    collectives cannot be undone, so the world starts again with every rank's variables."""
    needs("accelerate")
    assert session.run("%%mpi\nkept_before = rank * 10").status == "ok"
    time.sleep(2)  # as a person reads between cells: each rank snapshots its variables once idle for 0.2 s
    shown = session.run(ACCELERATE_MISMATCH, timeout=CELL_TIMEOUT)
    assert shown.status == "error", shown.text
    assert not shown.internal_frames(), shown.text
    assert re.search(r"collective #\d+ on torch:default: rank 0 in all_reduce\(1 x float32\) at cell line 8; rank 1 in "
                     r"all_gather\(1 x float32\) at cell line 10\.", shown.text), shown.text
    assert "Likely the ranks call collectives in a different order" in shown.text
    assert 'called at cell line 8: summed = accelerator.reduce(total, reduction="sum")' in shown.text
    assert "Timed out" not in shown.text and "restored every rank's variables" in shown.text, shown.text
    kept = session.run("%%mpi\nprint('kept', kept_before)")
    assert lines(kept, "kept") == {"0": "0", "1": "10"}, kept.text


# --- the debugger inside a framework's loop -------------------------------------------------------------------

TRAINER_BREAKPOINT = """%%mpi
import torch
import lightning as L

class Paused(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if batch_idx == 1 and self.global_rank == 1:
            breakpoint()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

L.seed_everything(0)
paused = Paused()
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=3, enable_checkpointing=False,
                    logger=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(paused, torch.utils.data.DataLoader(data, batch_size=4))
print("trained", trainer.global_step, fingerprint(paused))
"""


def test_a_breakpoint_in_a_lightning_training_step_stops_that_rank_in_the_notebook(session):
    """``breakpoint()`` inside ``training_step``, called by Lightning's loop deep under ``Trainer.fit``: rank 1's
    pdb prompt comes to the notebook at the cell's line, its locals readable; rank 0 waits in DDP's all_reduce
    meanwhile (not called a mismatch), and both finish training, the same weights on both."""
    needs("lightning")
    assert session.run(FINGERPRINT).status == "ok"
    shown = session.run(TRAINER_BREAKPOINT, timeout=CELL_TIMEOUT,
                        answers=["p batch_idx", "p (self.global_rank, x.shape[0], loss.item() >= 0)", "c"])
    assert shown.status == "ok", shown.text
    assert shown.prompts == ["(rank 1) (Pdb) "] * 3, shown.prompts
    assert re.search(r"^\[rank 1\] > Cell In\[\d+\]\(15\)training_step\(\)$", shown.text, re.M), shown.text
    assert "[rank 1] 1\n" in shown.text and "[rank 1] (1, 4, True)" in shown.text, shown.text
    trained = lines(shown, "trained")
    assert trained["0"] == trained["1"] and trained["0"].startswith("3 "), shown.text
    assert "CollectiveMismatch" not in shown.text and not shown.internal_frames(), shown.text


FABRIC_NAN = """%%mpi
fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
layer = torch.nn.Linear(4, 1)
model, optimizer = fabric.setup(layer, torch.optim.SGD(layer.parameters(), lr=0.1))

def train_step(x):
    loss = model(x).pow(2).mean()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss {loss.item()} at step {step}")
    fabric.backward(loss)
    optimizer.step()

for step in range(4):
    train_step(torch.full((8, 4), float("nan")) if step == 2 else torch.randn(8, 4))
"""


def test_post_mortem_inside_a_fabric_training_step(session):
    """A loss that turns NaN at step 2 on every rank of a Fabric loop: the world is kept, and ``%mpi debug 1``
    opens pdb where rank 1 raised, with the step's locals and ``up`` into the cell's loop."""
    needs("lightning")
    assert session.run("%%mpi\nimport torch\nfrom lightning.fabric import Fabric").status == "ok"
    shown = session.run(FABRIC_NAN, timeout=CELL_TIMEOUT)
    assert shown.status == "error", shown.text
    assert "ranks 0-1: FloatingPointError: loss nan at step 2" in shown.text, shown.text
    assert "started again" not in shown.text
    debug = session.run("%mpi debug 1", answers=["p step", "p loss.isnan().item()", "up", "p step + 1", "q"])
    assert debug.status == "ok", debug.text
    assert debug.prompts == ["(rank 1) (Pdb) "] * 5, debug.text
    assert re.search(r"^\[rank 1\] > Cell In\[\d+\]\(10\)train_step\(\)$", debug.text, re.M), debug.text
    assert "[rank 1] 2\n" in debug.text and "[rank 1] True" in debug.text and "[rank 1] 3" in debug.text, debug.text
    assert not debug.internal_frames(), debug.text


# --- Hugging Face Trainer -----------------------------------------------------------------------------------------

HF_TRAINER = """%%mpi
import tempfile
import torch, mpinb, transformers

class Report(transformers.TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            mpinb.report(step=state.global_step, loss=logs["loss"])

torch.manual_seed(0)
config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32)
bert = transformers.BertForSequenceClassification(config)
print("hf start", fingerprint(bert))
g = torch.Generator().manual_seed(1)
dataset = [{"input_ids": torch.randint(1, 50, (8,), generator=g), "labels": i % 2} for i in range(16)]
with tempfile.TemporaryDirectory() as tmp:
    args = transformers.TrainingArguments(output_dir=tmp, use_cpu=True, ddp_backend="gloo", max_steps=3,
                                          per_device_train_batch_size=2, report_to=[], save_strategy="no",
                                          logging_steps=1)
    trainer = transformers.Trainer(model=bert, args=args, train_dataset=dataset, callbacks=[Report()])
    result = trainer.train()
print("hf rank", args.process_index, args.world_size, args.parallel_mode, result.global_step)
print("hf end", fingerprint(trainer.model))
"""


def test_hugging_face_trainer_trains_and_its_callback_reports(session):
    needs("transformers")
    shown, steps = new_metrics(session, HF_TRAINER)
    assert lines(shown, "hf rank") == {"0": "0 2 ParallelMode.DISTRIBUTED 3", "1": "1 2 ParallelMode.DISTRIBUTED 3"}, \
        shown.text
    assert_equal_replicas(shown, "hf")
    assert steps == {0: [1, 2, 3], 1: [1, 2, 3]}, shown.text
    who = session.run("%mpi who")
    assert who.status == "ok", who.text
    assert re.search(r"^trainer +all +Trainer ", who.text, re.M) and re.search(r"^bert +all ", who.text, re.M), \
        who.text


# --- Lightning Trainer --------------------------------------------------------------------------------------------

TRAINER = """%%mpi
import torch, mpinb
import lightning as L

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

class Report(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        mpinb.report(step=trainer.global_step, loss=float(outputs["loss"]))

L.seed_everything(0)
module = Tiny()
print("trainer start", fingerprint(module))
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
trainer = L.Trainer(accelerator="cpu", devices=2, strategy=STRATEGY, max_steps=4, enable_checkpointing=False,
                    logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[Report()])
trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
print("trainer rank", trainer.global_rank, trainer.world_size, trainer.global_step, type(trainer.strategy).__name__,
      trainer.strategy.cluster_environment)
print("trainer end", fingerprint(module))
"""


@pytest.mark.parametrize("strategy", ["ddp", "auto"])
def test_lightning_trainer_trains_and_its_callback_reports(session, strategy):
    """Nothing of mpinb's in the Trainer's arguments: Lightning finds the world through torchrun's variables
    (``TorchElasticEnvironment``), and ``"auto"`` picks DDP because a rank is no interactive shell."""
    needs("lightning")
    shown, steps = new_metrics(session, TRAINER.replace("STRATEGY", repr(strategy)))
    said = lines(shown, "trainer rank")
    assert [text.split(" <")[0] for _, text in sorted(said.items())] == \
        ["0 2 4 DDPStrategy", "1 2 4 DDPStrategy"], shown.text
    assert all("TorchElasticEnvironment" in text for text in said.values()), shown.text
    assert_equal_replicas(shown, "trainer")
    assert steps == {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]}, shown.text


AFTER_TRAINER = """%%mpi
if rank == 1:
    raise ValueError("rank 1 fails")
comm.Barrier()
"""


def test_a_failure_after_a_lightning_trainer_is_diagnosed(session):
    """After a Trainer has run, a rank that fails while another waits in a collective is diagnosed as without it:
    the waiting rank is stopped, named where it waits, and the world kept. (Lightning's ``Trainer.fit`` sets every
    signal's handler back to what ``signal.getsignal()`` said, SIG_DFL for the ones faulthandler installed in C:
    the next stack request ended the rank. Each rank puts them back after every cell.)"""
    needs("lightning")
    try:
        run(session, TRAINER.replace("STRATEGY", "'ddp'"))
        shown = session.run(AFTER_TRAINER, timeout=CELL_TIMEOUT)
        assert shown.status == "error", shown.text
        assert "rank 0: Aborted: stopped after rank 1 failed, blocked in comm.Barrier() at cell line" in shown.text, \
            shown.text
        assert "the world and every rank's variables are kept" in shown.text
        assert "RankLost" not in shown.text
    finally:
        if session.run("%%mpi\npass").status != "ok":
            fresh_world(session)
