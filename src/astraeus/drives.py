"""Where a drive can be reached from, and how: pure rules shared by the control plane (placement, the mounts and
exports it hands the agents) and the agents.

A drive's bytes are in one of two places (spec.DriveSource):
- a folder on one machine (`node`): a worker there binds it; a worker on another machine mounts it over NFS from
  the keeping machine, which exports the folder to that machine's address only ("over RDMA when both machines have
  it, else TCP");
- a folder of a shared filesystem (`filesystem`) that machines have mounted already (NFS, Lustre, …) and declare
  with `astraeus agent --shared-fs NAME=/mnt/path`: a worker is placed only on machines that declare it.

Until a drive can be reached on a machine, workers that need it are not placed there; `unreachable()` says why, in
the words the run's "why it is not running yet" shows for that machine.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field

NFS_TCP_PORT = 2049
NFS_RDMA_PORT = 20049  # the IANA port of NFS over RDMA, as the drive form says


@dataclass(frozen=True)
class MachineFacts:
    """What the control plane knows of a machine for drives (from its registration)."""

    name: str
    ready: bool = True
    address: str | None = None
    shared_filesystems: dict[str, str] = field(default_factory=dict)
    nfs_server: str | None = None  # "ganesha" | "kernel" | None
    nfs_client: bool = False
    rdma: bool = False

    @classmethod
    def of(cls, name: str, ready: bool, address: str | None, shared: dict | None, nfs: dict | None) -> MachineFacts:
        nfs = nfs or {}
        return cls(name=name, ready=ready, address=address, shared_filesystems=dict(shared or {}),
                   nfs_server=nfs.get("server"), nfs_client=bool(nfs.get("client")), rdma=bool(nfs.get("rdma")))


def choose_transport(transport: str, server_rdma: bool, client_rdma: bool) -> tuple[str, int]:
    """(proto, port) for NFS between a keeping machine and a worker's machine: `Auto` is RDMA on port 20049 when
    both have RDMA, else TCP on 2049; `TCP` and `RDMA` force one."""
    if transport == "RDMA" or (transport == "Auto" and server_rdma and client_rdma):
        return "rdma", NFS_RDMA_PORT
    return "tcp", NFS_TCP_PORT


def export_path(drive: str) -> str:
    """Where the keeping machine's NFS server shows drive `<workspace ns>.<name>`: one flat folder per drive, so that
    two drives never nest whatever their folders are."""
    return f"/astraeus/{drive}"


def shared_path(mount: str, path: str) -> str:
    """The folder on a machine of `path` inside a shared filesystem mounted at `mount`."""
    return posixpath.join(mount, path.lstrip("/")).rstrip("/") or "/"


def unreachable(drive: str, source: dict, transport: str, machine: MachineFacts,
                keeper: MachineFacts | None) -> str | None:
    """Why a worker needing drive `drive` (its source, its transport) cannot be placed on `machine`, or None when it
    can. `keeper` is the machine named by a drive on one machine (None when no machine of that name has joined)."""
    fs = source.get("filesystem")
    if fs:
        if fs in machine.shared_filesystems:
            return None
        return (f"drive {drive} is on shared filesystem {fs}, which {machine.name} does not have (an agent declares "
                f"it with --shared-fs {fs}=/mount/path)")
    node = source.get("node")
    if node == machine.name:
        return None
    if keeper is None:
        return f"drive {drive} is kept on {node}, which is not a machine of this cluster"
    if not keeper.ready:
        return f"drive {drive} is kept on {node}, which is not Ready: its files cannot be reached from {machine.name}"
    if not keeper.nfs_server:
        return (f"drive {drive} is kept on {node}, which cannot export it over NFS (install nfs-ganesha there); a "
                f"worker elsewhere cannot mount it")
    if not machine.nfs_client:
        return f"drive {drive} is kept on {node}; {machine.name} cannot mount NFS (its kernel has no NFS client)"
    if transport == "RDMA" and not (keeper.rdma and machine.rdma):
        lacking = " and ".join(m.name for m in (keeper, machine) if not m.rdma)
        return f"drive {drive} asks for transport RDMA; {lacking} has no RDMA device"
    return None


# ------------------------------------------------------------------------------ folders one workspace holds
# A drive's folder belongs to one workspace: no drive of another workspace may be inside it, equal to it or above
# it (a bind mount of a folder inside another's drive skips that drive's 0700 folder), and no drive may hold a
# folder granted to another workspace (nor may a folder be granted inside another workspace's drive). Grants
# themselves may be shared or nested (a common data disk such as /data/astraeus granted to every workspace): a
# grant is where a workspace may make drives, and the drives in it are what must not overlap.
#
# A place is (kind, name, path): ("node", machine, folder on it) or ("fs", shared filesystem, folder inside it); a
# machine path granted on a cluster is ("node", ANY, path), on every machine of it. A shared filesystem's folder is
# also a folder of each machine that declares where it is mounted there, so a machine path and a filesystem folder
# are compared on those machines.

ANY = "*"


def source_places(source: dict, machines: Sequence[MachineFacts] = ()) -> list[tuple[str, str, str]]:
    """Where a drive source's folder is (see above)."""
    fs = source.get("filesystem")
    if fs:
        return [("fs", fs, source["path"])] + [("node", m.name, shared_path(m.shared_filesystems[fs], source["path"]))
                                               for m in machines if fs in m.shared_filesystems]
    return [("node", source.get("node") or ANY, source["path"])]


def grant_places(grant: str, machines: Sequence[MachineFacts] = ()) -> list[tuple[str, str, str]]:
    """Where a granted host path (`/path`, or `NAME:/path` inside shared filesystem NAME) is."""
    name, colon, rest = grant.partition(":")
    if colon and not grant.startswith("/"):
        return source_places({"filesystem": name, "path": rest}, machines)
    return [("node", ANY, grant)]


def _within(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or root == "/" or path.startswith(root + "/")


def _same(a: tuple[str, str, str], b: tuple[str, str, str]) -> bool:
    return a[0] == b[0] and (a[1] == b[1] or ANY in (a[1], b[1]))


def holds(outer: list[tuple[str, str, str]], inner: list[tuple[str, str, str]]) -> bool:
    """Whether a folder of `outer`'s places is `inner`'s or above it (on the same machine or filesystem)."""
    return any(_same(o, i) and _within(i[2], o[2]) for o in outer for i in inner)


def overlap(a: list[tuple[str, str, str]], b: list[tuple[str, str, str]]) -> bool:
    """Whether two folders' places are one inside (or equal to) the other anywhere."""
    return holds(a, b) or holds(b, a)
