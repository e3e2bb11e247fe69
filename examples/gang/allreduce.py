"""A multi-machine all_reduce, for `torchrun allreduce.py` with NO flags on every machine of a gang.

torchrun reads its flags from the environment Astraeus gives each worker of a multi-machine run
(PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE; see docs/api.md).
Gloo backend on CPU: every rank contributes rank + 1, the sum is W (W + 1) / 2. Exits 0 when it is right.
"""
import os
import socket
import sys

import torch
import torch.distributed as dist

addrs = os.environ.get("ASTRAEUS_NODE_ADDRS", "").split(",")
node = int(os.environ.get("ASTRAEUS_NODE_RANK", "0"))
me = addrs[node] if node < len(addrs) else None

dist.init_process_group("gloo")  # over GLOO_SOCKET_IFNAME, the worker's own interface (the agent's)
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t, op=dist.ReduceOp.SUM)
s = int(t.item())
# one write per line: the processes of a machine share one log, and print's text and newline could interleave
print(f"rank {rank} of {world} on {socket.gethostname()}/{me or '?'}: all_reduce sum = {s}\n", end="", flush=True)
dist.destroy_process_group()
sys.exit(0 if s == world * (world + 1) // 2 else 1)
