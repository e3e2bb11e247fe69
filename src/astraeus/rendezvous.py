"""Rendezvous for a gang placed on several machines: what each of its workers finds in its environment so that
`torchrun train.py` (no flags), a Slurm-minded script or a hand-written `init_process_group` finds its peers.

Pure: the control plane calls it once per gang attempt, when the gang is placed, and keeps the result on each
worker row (so the values are stable for the attempt and new for the next one). A gang is a run whose workers
start together (start: Gang) and which has two workers or more; rank = the worker's index.

Names (docs/api.md, "What a worker finds in its environment"):
  Astraeus   ASTRAEUS_NODE_RANK, ASTRAEUS_NUM_NODES, ASTRAEUS_MASTER_ADDR, ASTRAEUS_MASTER_PORT, ASTRAEUS_NODE_ADDRS
  torchrun   PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE (torchrun reads its
             flags from PET_<FLAG>), and MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK
  Slurm      SLURM_JOB_NUM_NODES, SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST, SLURM_NODELIST, SLURM_PROCID,
             SLURM_LOCALID, SLURMD_NODENAME, SLURM_GPUS_ON_NODE

With networks of their own (the default, `network: isolated`), each worker of the gang has an address of its own
(ASTRAEUS_WORKER_ADDR), unique among the cluster's live gangs and routed between the machines: MASTER_ADDR and
NODE_ADDRS are the workers' addresses, which only the gang's own workers reach.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass

# The ports a gang's rank 0 listens on (torchrun's TCPStore): the control plane gives each live gang attempt of a
# cluster its own, so that two gangs whose rank 0 share a machine (or a host, for machines without their own
# network) never collide. 29500 is torch's default MASTER_PORT; the range sits below Linux's ephemeral ports.
PORTS = range(29500, 30500)

# The addresses of gangs' workers with networks of their own, cluster-wide (a machine's other workers take theirs
# from a pool of its own, astraeus.agent.network): inside the shared address space of RFC 6598, rarely routed by
# a site.
ADDRESSES = ipaddress.ip_network("100.64.0.0/12")


@dataclass(frozen=True)
class Node:
    """One worker of the gang, in rank order: the machine it was placed on."""

    machine: str
    address: str | None  # the machine's registered address; its name where an older agent gave none
    gpus: int
    worker_address: str | None = None  # the worker's own address (a network of its own), else None


def is_gang(start: str | None, workers: int) -> bool:
    return (start or "Gang") != "Independent" and workers >= 2


def choose_port(used: set[int], seed: str, ports: range = PORTS) -> int:
    """A port of `ports` that no other live gang attempt uses, picked at random (seeded by the attempt, so the same
    attempt planned twice picks the same one; a new attempt most likely a new one, away from sockets the last
    attempt may have left in TIME_WAIT). ValueError when all are taken."""
    free = [p for p in ports if p not in used]
    if not free:
        raise ValueError(f"every rendezvous port {ports.start}-{ports.stop - 1} is in use by a live gang")
    return random.Random(seed).choice(free)


def choose_addresses(used: set[str], seed: str, n: int, pool: ipaddress.IPv4Network = ADDRESSES) -> list[str]:
    """`n` addresses of `pool` that no live gang worker of the cluster has, picked at random (seeded by the attempt,
    as choose_port). ValueError when the pool has too few left."""
    rng = random.Random(seed)
    size = pool.num_addresses - 2  # not the network's nor its broadcast address
    if size - len(used) < n:
        raise ValueError(f"fewer than {n} gang worker addresses of {pool} are free")
    out: list[str] = []
    while len(out) < n:
        a = str(pool.network_address + 1 + rng.randrange(size))
        if a not in used and a not in out:
            out.append(a)
    return out


def environments(run: str, nodes: list[Node], port: int) -> list[dict[str, str]]:
    """Each rank's environment, in rank order."""
    n = len(nodes)
    addrs = [nd.worker_address or nd.address or nd.machine for nd in nodes]
    master = addrs[0]
    out = []
    for rank, nd in enumerate(nodes):
        per_node = max(nd.gpus, 1)  # a CPU gang: one process per machine
        out.append({
            "ASTRAEUS_NODE_RANK": str(rank),
            "ASTRAEUS_NUM_NODES": str(n),
            "ASTRAEUS_MASTER_ADDR": master,
            "ASTRAEUS_MASTER_PORT": str(port),
            "ASTRAEUS_NODE_ADDRS": ",".join(addrs),
            "PET_NNODES": str(n),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": str(port),
            "PET_NPROC_PER_NODE": str(per_node),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(sum(max(x.gpus, 1) for x in nodes)),
            "NODE_RANK": str(rank),
            "SLURM_JOB_NUM_NODES": str(n),
            "SLURM_NNODES": str(n),
            "SLURM_NODEID": str(rank),
            "SLURM_JOB_NODELIST": ",".join(x.machine for x in nodes),
            "SLURM_NODELIST": ",".join(x.machine for x in nodes),
            "SLURM_PROCID": str(rank),  # one task per machine: the batch script is rank's task
            "SLURM_LOCALID": "0",
            "SLURMD_NODENAME": nd.machine,
            "SLURM_GPUS_ON_NODE": str(nd.gpus),
        })
        if nd.worker_address:
            out[-1]["ASTRAEUS_WORKER_ADDR"] = nd.worker_address
    return out


def hosts_file(base: str, names: list[str], addresses: list[str]) -> str:
    """A worker's /etc/hosts: `base` (the machine's own) without lines naming the job's machines, then each machine
    name of SLURM_JOB_NODELIST at its address in ASTRAEUS_NODE_ADDRS (rank order, the two lists paired), so that
    `head=$(scontrol show hostnames | head -n1)` reaches rank 0. The names are the machines' names, which the
    site's resolver need not know, and with networks of their own the workers' addresses are not the machines':
    a file of the job's own is the one place both hold. A name given twice keeps its first address."""
    pairs: dict[str, str] = {}
    for name, addr in zip(names, addresses, strict=False):
        if name and addr and name not in pairs:
            pairs[name] = addr
    kept = [line for line in base.splitlines()
            if not set(line.split("#", 1)[0].split()[1:]) & set(pairs)]
    out = "\n".join(kept).rstrip("\n")
    job = "\n".join(f"{addr}\t{name}" for name, addr in pairs.items())
    return (out + "\n" if out else "") + "# the job's machines (Astraeus)\n" + job + "\n"
