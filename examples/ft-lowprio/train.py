"""The checkpoint-friendly train.py of "Priorities, preemption and checkpoints", made runnable.

The page's loop is unchanged (below the marked block); the block above it defines what the page
leaves to you (build_model, build_optimizer, train_step, TOTAL_STEPS) with a tiny model on
synthetic data, so it runs anywhere: `python train.py`, or under
`torchrun --nproc-per-node=N train.py` (gloo on CPU, nccl on GPUs; gradients are averaged and
only rank 0 writes the checkpoint).

Environment: SLURM_JOB_NAME (the run's name; checkpoint in $CKPT_ROOT/<name>/latest.pt),
CKPT_ROOT (/ckpt), TOTAL_STEPS (20000), STEP_SLEEP (0 seconds after each step), LOG_EVERY (100).
"""
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

CKPT_DIR = os.path.join(os.environ.get("CKPT_ROOT", "/ckpt"), os.environ.get("SLURM_JOB_NAME", "run"))  # the run's name
CKPT = os.path.join(CKPT_DIR, "latest.pt")
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

# --------------------------------------------------------------------- what the page leaves to you
TOTAL_STEPS = int(os.environ.get("TOTAL_STEPS", "20000"))
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0"))
LOG_EVERY = int(os.environ.get("LOG_EVERY", "100"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
RANK = int(os.environ.get("RANK", "0"))
device = "cpu"
if WORLD > 1:  # under torchrun
    if torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device != "cpu" else "gloo")
elif torch.cuda.is_available():
    device = "cuda"
torch.set_num_threads(1)
torch.manual_seed(0)
_built = {}
_sigterm = threading.Event()
if WORLD > 1:  # the ranks agree in train_step on when to stop, so none is left waiting in an all_reduce
    signal.signal(signal.SIGTERM, lambda signum, frame: _sigterm.set())
_target = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))  # the function to learn


def build_model():
    _built["model"] = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)
    return _built["model"]


def build_optimizer():
    return torch.optim.SGD(_built["model"].parameters(), lr=0.01, momentum=0.9)


def train_step(model, opt, step):
    g = torch.Generator().manual_seed(step * WORLD + RANK)  # each step's batch is the same on every attempt
    x = torch.randn(64, 32, generator=g)
    y = x @ _target
    loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if WORLD > 1:  # average gradients; a SIGTERM seen by any rank stops every rank at the same step
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= WORLD
        flag = torch.tensor([1.0 if _sigterm.is_set() else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            stop.set()
    opt.step()
    if STEP_SLEEP:
        time.sleep(STEP_SLEEP)
    if RANK == 0 and step % LOG_EVERY == 0:
        print(json.dumps({"step": step, "loss": round(loss.item(), 4)}), flush=True)


# ---------------------------------------------------------------------------- end of that block


def save(step, model, opt):
    if RANK != 0:  # added: under torchrun, rank 0 alone writes the checkpoint
        return
    os.makedirs(CKPT_DIR, exist_ok=True)
    tmp = CKPT + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, CKPT)  # atomic: a kill mid-save keeps the previous one
    if stop.is_set():  # added: say so in the log
        print(f"SIGTERM: checkpoint at step {step} written; exiting", flush=True)


model, opt = build_model(), build_optimizer()
start = 0
if os.path.exists(CKPT):
    state = torch.load(CKPT, map_location="cpu")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"] + 1
    if RANK == 0:
        print(f"resuming at step {start}", flush=True)

for step in range(start, TOTAL_STEPS):
    train_step(model, opt, step)
    if stop.is_set():
        save(step, model, opt)
        sys.exit(0)
    if step % 500 == 0:
        save(step, model, opt)

if RANK == 0:
    print("done", flush=True)
