"""A small CPU fine-tune for a multi-machine gang: `torchrun finetune.py` (no flags) on every machine.

torchrun reads its flags from the environment Astraeus gives each worker of a multi-machine run (PET_*; see
docs/api.md). Gloo backend, DistributedDataParallel over a tiny model on seeded synthetic data (each step's batch
is the same on every attempt). The checkpoint lives on a drive both machines see (a shared filesystem, at
CKPT_ROOT): every rank reads it to resume; rank 0 alone writes it, after a barrier (every rank has finished the
step), atomically (a temporary file, then a rename), every SAVE_EVERY steps and when the gang is stopped.

Stopping: torchrun forwards SIGTERM to its processes. A rank that gets it finishes its step; the ranks agree (an
all_reduce of a stop flag) to stop after that same step, meet at a barrier, rank 0 saves, and all exit 0.

Log lines (rank 0): `attempt A: W processes on N machines, master ADDR:PORT`, `resuming at step N`, {"step": N, "loss": L} every LOG_EVERY steps, `checkpoint at step N`
for a periodic save, `SIGTERM: checkpoint at step N written; exiting`, `done`. N counts the steps done, so an
attempt resumes at exactly the step its predecessor saved.

Environment: CKPT_ROOT (/ckpt; the checkpoint is $CKPT_ROOT/<run name>/ckpt.pt), TOTAL_STEPS (2000),
SAVE_EVERY (50), LOG_EVERY (10), STEP_SLEEP (0 seconds after each step: a pace for a demo or a test).
"""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

RUN = os.environ.get("ASTRAEUS_RUN_NAME") or os.environ.get("SLURM_JOB_NAME") or "local"
CKPT_DIR = os.path.join(os.environ.get("CKPT_ROOT", "/ckpt"), RUN)
CKPT = os.path.join(CKPT_DIR, "ckpt.pt")
TOTAL_STEPS = int(os.environ.get("TOTAL_STEPS", "2000"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "50"))
LOG_EVERY = int(os.environ.get("LOG_EVERY", "10"))
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0"))

sigterm = False


def on_sigterm(signum, frame):
    global sigterm
    sigterm = True


signal.signal(signal.SIGTERM, on_sigterm)


torch.set_num_threads(1)
dist.init_process_group("gloo")
RANK, WORLD = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
target = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))  # the function to learn

if RANK == 0:
    print(f"attempt {os.environ.get('ASTRAEUS_ATTEMPT', '?')}: {WORLD} processes on "
          f"{os.environ.get('PET_NNODES', '1')} machines, master {os.environ.get('MASTER_ADDR')}:"
          f"{os.environ.get('MASTER_PORT')}", flush=True)
start = 0
if os.path.exists(CKPT):
    state = torch.load(CKPT, map_location="cpu")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
    if RANK == 0:
        print(f"resuming at step {start}", flush=True)
ddp = DistributedDataParallel(model)


def save(step: int) -> None:
    """Every rank has finished `step` steps (the barrier); rank 0 writes the checkpoint."""
    dist.barrier()
    if RANK != 0:
        return
    os.makedirs(CKPT_DIR, exist_ok=True)
    tmp = CKPT + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, CKPT)  # atomic: a kill mid-save keeps the previous checkpoint whole


for step in range(start, TOTAL_STEPS):
    g = torch.Generator().manual_seed(step * WORLD + RANK)  # this rank's batch of this step, on every attempt
    x = torch.randn(64, 32, generator=g)
    loss = torch.nn.functional.mse_loss(ddp(x), x @ target)
    opt.zero_grad(set_to_none=True)
    loss.backward()  # DDP averages the gradients over every rank
    opt.step()
    done = step + 1
    if STEP_SLEEP:
        time.sleep(STEP_SLEEP)
    if RANK == 0 and done % LOG_EVERY == 0:
        print(json.dumps({"step": done, "loss": round(loss.item(), 4)}), flush=True)
    stop = torch.tensor([1.0 if sigterm else 0.0])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # a SIGTERM seen by any rank stops every rank after this step
    if stop.item():
        save(done)
        if RANK == 0:
            print(f"SIGTERM: checkpoint at step {done} written; exiting", flush=True)
        dist.destroy_process_group()
        sys.exit(0)
    if done % SAVE_EVERY == 0:
        save(done)
        if RANK == 0:
            print(f"checkpoint at step {done}", flush=True)

save(TOTAL_STEPS)
if RANK == 0:
    print("done", flush=True)
dist.destroy_process_group()
