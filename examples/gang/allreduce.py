"""A multi-machine all_reduce, for `torchrun allreduce.py` with NO flags on every machine of a gang.

torchrun reads its flags from the environment Astraeus gives each worker of a multi-machine run
(PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE; see docs/api.md).
Gloo backend on CPU: every rank contributes rank + 1, the sum is W (W + 1) / 2. Exits 0 when it is right.
"""
import fcntl
import os
import socket
import struct
import sys

import torch
import torch.distributed as dist


def interface_with(addr: str) -> str | None:
    """The network interface holding `addr` (IPv4), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR
                got = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(got[20:24]) == addr:
                return name
    return None


# Gloo finds its own address from the hostname, which often resolves to 127.0.x.x (Debian's /etc/hosts, or
# several machines sharing one host's files): peers on other machines could not reach that. Use the interface
# that holds this machine's address in the gang instead.
addrs = os.environ.get("ASTRAEUS_NODE_ADDRS", "").split(",")
node = int(os.environ.get("ASTRAEUS_NODE_RANK", "0"))
me = addrs[node] if node < len(addrs) and addrs[node] else None
if me and "GLOO_SOCKET_IFNAME" not in os.environ and (ifname := interface_with(me)):
    os.environ["GLOO_SOCKET_IFNAME"] = ifname

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t, op=dist.ReduceOp.SUM)
s = int(t.item())
# one write per line: the processes of a machine share one log, and print's text and newline could interleave
print(f"rank {rank} of {world} on {socket.gethostname()}/{me or '?'}: all_reduce sum = {s}\n", end="", flush=True)
dist.destroy_process_group()
sys.exit(0 if s == world * (world + 1) // 2 else 1)
