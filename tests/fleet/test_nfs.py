"""Drives across machines over NFS (astraeus.agent.nfs): NFS-Ganesha on this host exports a drive's folder to one
network namespace's address only, and libnfs' userspace client (`nfs-cp`, `nfs-ls`) reads and writes it from that
namespace and is refused from another; an export trusts no client's word: a process of a listed machine that
cannot bind a privileged port (a worker: not root, or root without CAP_NET_BIND_SERVICE) is refused whatever uid it
states, every uid lands as the drive's owner, and the pseudo-root lists to a client only the exports it may use;
the mount options the transports give; a mount that never gets an answer
ends with a clear reason at its deadline; and, on a cluster of two machines in their own namespaces, the keeping
agent exports a drive to exactly the machine that runs its worker, and stops when that worker ends.

This host's kernel has no NFS client or server (/proc/filesystems lists no nfs): the kernel mount is tested only
where it has one (the one skip), and a machine here claims an NFS client only when told (ASTRAEUS_NFS_CLIENT)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from astraeus import protocol as P
from astraeus.agent import nfs
from astraeus.drives import NFS_RDMA_PORT, NFS_TCP_PORT, choose_transport
from tests.conftest import free_port, start_cluster, wait_for

needs_ganesha = pytest.mark.skipif(
    nfs.nfs_ability().server != "ganesha" or not shutil.which("nfs-cp") or os.geteuid() != 0,
    reason="needs root, NFS-Ganesha (nfs-ganesha nfs-ganesha-vfs) and libnfs-utils (make system-deps)")

NS = "ws-" + "0123456789ab"  # a workspace namespace, as the control plane names them


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class Nets:
    """Network namespaces, each joined to this host by a veth pair on its own /30: `host(name)` is this host's
    address on that link (where Ganesha answers), `addr(name)` the namespace's."""

    def __init__(self):
        self.tag = secrets.token_hex(2)
        self.net = 100 + int(self.tag, 16) % 150
        self.names: dict[str, int] = {}

    def add(self, name: str, blackhole: bool = False) -> str:
        i = len(self.names)
        self.names[name] = i
        ns, h, c = self.ns(name), f"bnh{self.tag}{i}", f"bnc{self.tag}{i}"
        ip("netns", "add", ns)
        ip("link", "add", h, "type", "veth", "peer", "name", c)
        ip("link", "set", c, "netns", ns)
        ip("addr", "add", f"{self.host(name)}/30", "dev", h)
        ip("link", "set", h, "up")
        ip("-n", ns, "addr", "add", f"{self.addr(name)}/30", "dev", c)
        ip("-n", ns, "link", "set", c, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        if blackhole:  # packets come in; nothing ever goes back to this host: a server that never answers
            ip("-n", ns, "route", "add", "blackhole", f"{self.host(name)}/32")
        return self.addr(name)

    def ns(self, name: str) -> str:
        return f"bnfs-{self.tag}-{name}"

    def host(self, name: str) -> str:
        return f"10.{self.net}.{self.names[name]}.1"

    def addr(self, name: str) -> str:
        return f"10.{self.net}.{self.names[name]}.2"

    def run(self, name: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns(name), *argv], capture_output=True, text=True,
                              timeout=timeout)

    def remove(self) -> None:
        for name, i in self.names.items():
            ip("link", "del", f"bnh{self.tag}{i}", check=False)
            ip("netns", "del", self.ns(name), check=False)


@pytest.fixture
def nets():
    n = Nets()
    yield n
    n.remove()


@pytest.fixture
def exports(tmp_path):
    x = nfs.Exports(str(tmp_path / "state"), port=free_port())
    yield x
    x.stop()


def url(nets: Nets, name: str, port: int, path: str, **args) -> str:
    q = "&".join([f"version=4&nfsport={port}"] + [f"{k}={v}" for k, v in args.items()])
    return f"nfs://{nets.host(name)}{path}?{q}"


# libnfs run as root binds a privileged source port (as the agent's kernel mount does: resvport); these run it as
# a worker would be: root without CAP_NET_BIND_SERVICE (so ports < 1024 are not bindable), or another user.
NO_BIND_CAP = ("setpriv", "--bounding-set=-net_bind_service")
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def ganesha_pids(conf: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        argv = nfs._cmdline(int(pid))
        if argv and os.path.basename(argv[0]) == "ganesha.nfsd" and conf in argv and nfs._pid_alive(int(pid)):
            out.append(int(pid))
    return out


# ------------------------------------------------------------------------------------------------ the exports
@needs_ganesha
def test_drive_exported_to_its_machines_only_and_unexported_after_the_last(nets, exports, tmp_path):
    nets.add("gpu-02")
    nets.add("gpu-03")
    root = tmp_path / "data"
    root.mkdir()
    (root / "datasets").mkdir()
    (root / "datasets" / "train.txt").write_text("tokens\n")
    ckpt = P.Export(drive=f"{NS}.ft-ckpt", path=str(root / "ft-ckpt"), granted_root=str(root),
                    clients=[nets.addr("gpu-02")], create=True)
    data = P.Export(drive=f"{NS}.datasets", path=str(root / "datasets"), granted_root=str(root),
                    clients=[nets.addr("gpu-03"), nets.addr("gpu-02")], read_only=True)
    assert exports.apply([ckpt, data]) == {}
    uid, gid = nfs.workspace_ids(ckpt.drive, None)
    st = (root / "ft-ckpt").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (uid, gid, 0o700)  # made, and handed to the workspace

    # gpu-02 writes a checkpoint (its root acts as the workspace's user there) and reads it back
    src = tmp_path / "step-7.pt"
    src.write_bytes(b"weights at step 7\n")
    w = nets.run("gpu-02", "nfs-cp", str(src), url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.ft-ckpt/step-7.pt"))
    assert w.returncode == 0 and "copied 18 bytes" in w.stdout, w.stderr
    saved = root / "ft-ckpt" / "step-7.pt"
    assert saved.read_bytes() == b"weights at step 7\n" and saved.stat().st_uid == uid
    back = tmp_path / "back.pt"
    r = nets.run("gpu-02", "nfs-cp", url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.ft-ckpt/step-7.pt"),
                 str(back))
    assert r.returncode == 0 and back.read_bytes() == b"weights at step 7\n", r.stderr
    # whatever uid a client states, it acts as the workspace's user (All_Squash): what it writes is that user's
    other = nets.run("gpu-02", "nfs-cp", str(src),
                     url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.ft-ckpt/x.pt", uid=4242, gid=4242))
    assert other.returncode == 0, other.stderr
    assert (st := (root / "ft-ckpt" / "x.pt").stat()) and (st.st_uid, st.st_gid) == (uid, gid)
    # the ReadOnly drive reads from both machines and takes no write
    ls = nets.run("gpu-03", "nfs-ls", url(nets, "gpu-03", exports.port, f"/astraeus/{NS}.datasets"))
    assert ls.returncode == 0 and "train.txt" in ls.stdout, ls.stderr
    ro = nets.run("gpu-03", "nfs-cp", str(src), url(nets, "gpu-03", exports.port, f"/astraeus/{NS}.datasets/x.pt"))
    assert ro.returncode != 0 and "NFS4ERR_ROFS" in ro.stderr and not (root / "datasets" / "x.pt").exists()

    # gpu-03 runs no worker of ft-ckpt: refused, and nothing it sends lands in the folder
    ls = nets.run("gpu-03", "nfs-ls", url(nets, "gpu-03", exports.port, f"/astraeus/{NS}.ft-ckpt"))
    assert ls.returncode != 0 and "NFS4ERR_NOENT" in ls.stderr and "step-7" not in ls.stdout
    w = nets.run("gpu-03", "nfs-cp", str(src), url(nets, "gpu-03", exports.port, f"/astraeus/{NS}.ft-ckpt/evil.pt"))
    assert w.returncode != 0 and not (root / "ft-ckpt" / "evil.pt").exists()

    # gpu-02's worker moved to gpu-03: the list changes, the server re-reads it (same process)
    pids = ganesha_pids(exports.conf)
    assert len(pids) == 1
    assert exports.apply([ckpt.model_copy(update={"clients": [nets.addr("gpu-03")]})]) == {}
    assert ganesha_pids(exports.conf) == pids
    ls = nets.run("gpu-03", "nfs-ls", url(nets, "gpu-03", exports.port, f"/astraeus/{NS}.ft-ckpt"))
    assert ls.returncode == 0 and "step-7.pt" in ls.stdout, ls.stderr
    ls = nets.run("gpu-02", "nfs-ls", url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.ft-ckpt"))
    assert ls.returncode != 0 and "NFS4ERR_NOENT" in ls.stderr

    # the last worker elsewhere ended: nothing is exported, and the server is gone
    assert exports.apply([]) == {}
    assert ganesha_pids(exports.conf) == [] and not os.path.exists(exports.conf)
    ls = nets.run("gpu-03", "nfs-ls", url(nets, "gpu-03", exports.port, f"/astraeus/{NS}.ft-ckpt"))
    assert ls.returncode != 0 and "step-7" not in ls.stdout
    assert saved.read_bytes() == b"weights at step 7\n"  # the bytes stay on the keeping machine


@needs_ganesha
def test_a_listed_machine_is_refused_from_an_unprivileged_port_whatever_uid_it_states(nets, exports, tmp_path):
    """PrivilegedPort: a worker on a listed machine (its traffic masqueraded as the machine's address, with
    ASTRAEUS_WORKER_EGRESS=all or on `network: host`) cannot bind a port below 1024, so it is refused, even stating
    uid 0; the same read from root's privileged port works."""
    nets.add("gpu-02")
    root = tmp_path / "data"
    root.mkdir()
    e = P.Export(drive=f"{NS}.ft-ckpt", path=str(root / "ft-ckpt"), granted_root=str(root),
                 clients=[nets.addr("gpu-02")], create=True)
    assert exports.apply([e]) == {}
    uid, gid = nfs.workspace_ids(e.drive, None)
    (root / "ft-ckpt" / "step-1.pt").write_text("A's weights\n")
    os.chown(root / "ft-ckpt" / "step-1.pt", uid, gid)
    src = Path("/dev/shm") / f"bnfs-{secrets.token_hex(4)}.pt"  # readable by every user
    src.write_text("B's plant\n")
    src.chmod(0o644)
    file = url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.ft-ckpt/step-1.pt")
    try:
        ok = nets.run("gpu-02", "nfs-cat", file)  # root: a privileged source port
        assert ok.returncode == 0 and ok.stdout == "A's weights\n", ok.stderr
        for who in (NO_BIND_CAP, NOBODY):
            for uid_said in ({}, {"uid": 0, "gid": 0}):
                read = nets.run("gpu-02", *who, "nfs-cat", url(nets, "gpu-02", exports.port,
                                                               f"/astraeus/{NS}.ft-ckpt/step-1.pt", **uid_said))
                assert read.returncode != 0 and "A's weights" not in read.stdout, (who, uid_said, read.stdout)
                assert "NFS4ERR_NOENT" in read.stderr, read.stderr  # as if the export were not there
                plant = nets.run("gpu-02", *who, "nfs-cp", str(src), url(nets, "gpu-02", exports.port,
                                                                         f"/astraeus/{NS}.ft-ckpt/plant.pt", **uid_said))
                assert plant.returncode != 0, (who, uid_said, plant.stdout)
                ls = nets.run("gpu-02", *who, "nfs-ls", url(nets, "gpu-02", exports.port, "/astraeus", **uid_said))
                assert ls.returncode == 0 and "ft-ckpt" not in ls.stdout, ls.stdout  # not even listed
        assert sorted(p.name for p in (root / "ft-ckpt").iterdir()) == ["step-1.pt"]
        assert (root / "ft-ckpt" / "step-1.pt").read_text() == "A's weights\n"
        # and the same write from root's privileged port lands (as the drive's owner)
        w = nets.run("gpu-02", "nfs-cp", str(src), url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.ft-ckpt/ok.pt"))
        assert w.returncode == 0, w.stderr
        assert (root / "ft-ckpt" / "ok.pt").read_text() == "B's plant\n"
    finally:
        src.unlink()


@needs_ganesha
def test_every_uid_a_client_states_lands_as_the_drives_owner(nets, exports, tmp_path):
    """All_Squash: root (uid 0, stated by libnfs' `uid=0` or by being root) and any other uid act as the drive's
    workspace user: the files they write are that user's, and they read what that user may."""
    nets.add("gpu-02")
    root = tmp_path / "data"
    root.mkdir()
    e = P.Export(drive=f"{NS}.ft-ckpt", path=str(root / "ft-ckpt"), granted_root=str(root),
                 clients=[nets.addr("gpu-02")], create=True)
    assert exports.apply([e]) == {}
    uid, gid = nfs.workspace_ids(e.drive, None)
    assert (uid, gid) != (0, 0)
    src = tmp_path / "w.pt"
    src.write_text("w\n")
    said = {"root": {}, "uid0": {"uid": 0, "gid": 0}, "uid4242": {"uid": 4242, "gid": 4242},
            "owner": {"uid": uid, "gid": gid}}
    for name, args in said.items():
        w = nets.run("gpu-02", "nfs-cp", str(src), url(nets, "gpu-02", exports.port,
                                                       f"/astraeus/{NS}.ft-ckpt/{name}.pt", **args))
        assert w.returncode == 0, (name, w.stderr)
    owners = {p.name: (p.stat().st_uid, p.stat().st_gid) for p in (root / "ft-ckpt").iterdir()}
    assert owners == {f"{name}.pt": (uid, gid) for name in said}
    # a file of the keeping machine's root, mode 0600, is nobody's through NFS, root's word included
    (root / "ft-ckpt" / "roots.pt").write_text("root's\n")
    (root / "ft-ckpt" / "roots.pt").chmod(0o600)
    r = nets.run("gpu-02", "nfs-cat", url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.ft-ckpt/roots.pt",
                                          uid=0, gid=0))
    assert r.returncode != 0 and "root's" not in r.stdout and "NFS4ERR_ACCESS" in r.stderr, r.stderr


@needs_ganesha
def test_the_pseudo_root_lists_to_a_client_only_its_own_exports(nets, exports, tmp_path):
    """Workspace A's drive is exported to gpu-02, workspace B's to gpu-03: listing the server's NFSv4 pseudo-root
    from gpu-03 shows B's drive only (nothing names A's workspace), and a LOOKUP of A's name answers NOENT; gpu-02
    sees A's only."""
    nets.add("gpu-02")
    nets.add("gpu-03")
    ns_b = "ws-" + "ba9876543210"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert exports.apply([P.Export(drive=f"{NS}.adrive", path=str(tmp_path / "a"), clients=[nets.addr("gpu-02")]),
                          P.Export(drive=f"{ns_b}.bdrive", path=str(tmp_path / "b"),
                                   clients=[nets.addr("gpu-03")])]) == {}
    for machine, mine, other in (("gpu-03", f"{ns_b}.bdrive", NS), ("gpu-02", f"{NS}.adrive", ns_b)):
        top = nets.run(machine, "nfs-ls", url(nets, machine, exports.port, "/"))
        assert top.returncode == 0 and top.stdout.split()[-1:] == ["astraeus"], top.stdout + top.stderr
        ls = nets.run(machine, "nfs-ls", url(nets, machine, exports.port, "/astraeus"))
        assert ls.returncode == 0, ls.stderr
        assert [line.split()[-1] for line in ls.stdout.splitlines()] == [mine], ls.stdout
        assert other not in ls.stdout
        deep = nets.run(machine, "nfs-ls", "-R", url(nets, machine, exports.port, "/"))
        assert other not in deep.stdout + deep.stderr, deep.stdout
        guess = nets.run(machine, "nfs-ls", url(nets, machine, exports.port, f"/astraeus/{other}."
                                                f"{'bdrive' if other == ns_b else 'adrive'}"))
        assert guess.returncode != 0 and "NFS4ERR_NOENT" in guess.stderr, guess.stdout


@needs_ganesha
def test_export_refuses_symlinks_and_bad_addresses_and_keeps_the_rest(nets, exports, tmp_path):
    nets.add("gpu-02")
    root = tmp_path / "data"
    (root / "ok").mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.mkdir()
    (root / "link").symlink_to(secret)
    problems = exports.apply([
        P.Export(drive=f"{NS}.escape", path=str(root / "link"), granted_root=str(root), clients=[nets.addr("gpu-02")]),
        P.Export(drive=f"{NS}.outside", path=str(secret), granted_root=str(root), clients=[nets.addr("gpu-02")]),
        P.Export(drive=f"{NS}.badaddr", path=str(root / "ok"), granted_root=str(root), clients=["10.0.0.1; rm"]),
        P.Export(drive=f"{NS}.ok", path=str(root / "ok"), granted_root=str(root), clients=[nets.addr("gpu-02")]),
    ])
    assert "symlink" in problems[f"{NS}.escape"]
    assert "outside the granted host path" in problems[f"{NS}.outside"]
    assert "not an address or a host name" in problems[f"{NS}.badaddr"]
    assert f"{NS}.ok" not in problems
    ok = nets.run("gpu-02", "nfs-ls", url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.ok"))
    assert ok.returncode == 0, ok.stderr
    bad = nets.run("gpu-02", "nfs-ls", url(nets, "gpu-02", exports.port, f"/astraeus/{NS}.escape"))
    assert bad.returncode != 0 and "NFS4ERR_NOENT" in bad.stderr


@needs_ganesha
def test_a_server_left_by_a_crashed_agent_is_replaced(nets, tmp_path):
    nets.add("gpu-02")
    (tmp_path / "d").mkdir()
    port = free_port()
    e = P.Export(drive=f"{NS}.d", path=str(tmp_path / "d"), clients=[nets.addr("gpu-02")])
    first = nfs.Exports(str(tmp_path / "state"), port=port)
    first.apply([e])
    old = ganesha_pids(first.conf)
    assert len(old) == 1
    # the agent crashed (its Exports is gone, the server runs on); the next agent with the same state dir starts
    second = nfs.Exports(str(tmp_path / "state"), port=port)
    try:
        assert ganesha_pids(second.conf) == []  # the stale server was stopped
        assert second.apply([e]) == {}
        new = ganesha_pids(second.conf)
        assert len(new) == 1 and new != old
        ok = nets.run("gpu-02", "nfs-ls", url(nets, "gpu-02", port, f"/astraeus/{NS}.d"))
        assert ok.returncode == 0, ok.stderr
    finally:
        second.stop()
        first.proc and first.proc.poll()  # reap it
    assert ganesha_pids(second.conf) == []


# ------------------------------------------------------------------------------------------------ the mounts
@pytest.mark.parametrize("transport,server_rdma,client_rdma,proto,port", [
    ("Auto", True, True, "rdma", NFS_RDMA_PORT),
    ("Auto", True, False, "tcp", NFS_TCP_PORT),
    ("Auto", False, False, "tcp", NFS_TCP_PORT),
    ("TCP", True, True, "tcp", NFS_TCP_PORT),
    ("RDMA", True, True, "rdma", NFS_RDMA_PORT),
])
def test_mount_options_follow_the_drive_transport(transport, server_rdma, client_rdma, proto, port):
    got = choose_transport(transport, server_rdma, client_rdma)
    assert got == (proto, port)
    opts = nfs.mount_options(*got).split(",")
    assert opts[:3] == ["vers=4.2", f"proto={proto}", f"port={port}"] and "hard" in opts and "ro" not in opts
    assert "resvport" in opts and "noresvport" not in opts  # every export requires a privileged source port
    assert nfs.mount_options(*got, read_only=True).split(",")[-1] == "ro"


def test_every_export_requires_a_privileged_port_and_squashes_every_uid():
    conf = nfs.ganesha_config([
        {"id": 1, "path": "/data/a", "pseudo": "/astraeus/ws-a.d", "clients": {"10.0.0.2": "RW"}, "uid": 200001,
         "gid": 200001},
        {"id": 2, "path": "/data/b", "pseudo": "/astraeus/ws-b.d", "clients": {"10.0.0.3": "RO"}, "uid": 200002,
         "gid": 200002}], 2049, "/state/recovery", "/usr/lib/ganesha")
    blocks = conf.split("EXPORT {")[1:]
    assert len(blocks) == 2
    for block, n in zip(blocks, (200001, 200002), strict=True):
        assert "PrivilegedPort = true;" in block and "Squash = All_Squash;" in block
        assert f"Anonymous_Uid = {n}; Anonymous_Gid = {n};" in block and "SecType = sys;" in block
    assert "Root_Squash" not in conf and "No_Root_Squash" not in conf
    defaults = next(ln for ln in conf.splitlines() if ln.startswith("EXPORT_DEFAULTS"))
    assert "PrivilegedPort = true;" in defaults and "All_Squash" in defaults and "Access_Type = None;" in defaults


def test_mount_options_refuse_what_mount_would_not_take():
    with pytest.raises(ValueError, match="unknown NFS transport 'udp': tcp or rdma"):
        nfs.mount_options("udp", 2049)
    with pytest.raises(ValueError, match="NFS port 0 is not a port"):
        nfs.mount_options("tcp", 0)


def test_mount_of_a_server_that_never_answers_fails_at_its_deadline(nets, tmp_path):
    dark = nets.add("gpu-01", blackhole=True)
    src = P.NfsSource(server=dark, machine="gpu-01", export_path="/data/ft-ckpt", transport="tcp", port=2049)
    target = tmp_path / "nfs" / f"{NS}.ft-ckpt"
    t0 = time.monotonic()
    with pytest.raises(nfs.NfsMountError) as e:
        nfs.mount(src, str(target), deadline=3, drive=f"{NS}.ft-ckpt")
    took = time.monotonic() - t0
    assert str(e.value) == f"cannot mount drive ft-ckpt from gpu-01 ({dark}) over NFS/TCP: the server did not " \
                           "answer within 3 s"
    assert took < 3 + 10  # the deadline, plus killing the child and a lazy unmount
    assert not target.exists()


@needs_ganesha
def test_mount_names_the_machine_and_why(nets, exports, tmp_path):
    nets.add("gpu-01")
    (tmp_path / "d").mkdir()
    exports.apply([P.Export(drive=f"{NS}.ft-ckpt", path=str(tmp_path / "d"), clients=["127.0.0.1"])])
    target = tmp_path / "m"
    # nothing listens on that port: refused at once
    closed = P.NfsSource(server=nets.host("gpu-01"), machine="gpu-01", export_path="/", port=free_port())
    with pytest.raises(nfs.NfsMountError, match=rf"^cannot mount drive ft-ckpt from gpu-01 \({nets.host('gpu-01')}\) "
                                                r"over NFS/TCP: the server refused NFS on port \d+: Connection refused$"):
        nfs.mount(closed, str(target), deadline=10, drive=f"{NS}.ft-ckpt")
    if not ({"nfs", "nfs4"} & nfs._filesystems()):
        # the server answers; this machine's kernel cannot mount NFS, and the reason says so
        up = P.NfsSource(server=nets.host("gpu-01"), machine="gpu-01", export_path="/", port=exports.port)
        with pytest.raises(nfs.NfsMountError) as e:
            nfs.mount(up, str(target), deadline=10, drive=f"{NS}.ft-ckpt")
        assert str(e.value).startswith(f"cannot mount drive ft-ckpt from gpu-01 ({nets.host('gpu-01')}) over "
                                       "NFS/TCP: ")
        assert str(e.value).endswith("(this machine's kernel has no NFS client: /proc/filesystems lists no nfs4)")
    assert not target.exists()


@needs_ganesha
def test_a_drive_mounted_here_is_shared_asked_again_and_released(nets, exports, tmp_path):
    """NfsMounts: the second worker of a drive uses the folder the first one's mount made, after asking the server
    again (a server that went away makes its start fail, naming the machine); the folder is unmounted once no worker
    needs it. The kernel here cannot mount NFS, so a tmpfs stands where the first worker's NFS mount would be."""
    nets.add("gpu-01")
    (tmp_path / "d").mkdir()
    exports.apply([P.Export(drive=f"{NS}.ft-ckpt", path=str(tmp_path / "d"), clients=["127.0.0.1"])])
    state = tmp_path / "agent"
    mounts = nfs.NfsMounts(str(state), deadline=10)
    src = P.NfsSource(server=nets.host("gpu-01"), machine="gpu-01", export_path=str(tmp_path / "d"), port=exports.port)
    a = P.Assignment(worker=f"{NS}.trainer-0", attempt=1, workspace=NS, command="python", mounts=[
        P.Mount(drive="ft-ckpt", nfs=src, host_path="/run-1", mount_path="/ckpt", create=True),
        P.Mount(drive="local", host_path="/data/local", mount_path="/local")])
    target = state / "nfs" / f"{NS}.ft-ckpt"
    assert mounts.targets(a) == {str(target)}
    target.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
    try:
        local = mounts.local(a)
        m = local.mounts[0]
        assert (m.nfs, m.host_path, m.granted_root, m.mount_path, m.create) == (
            None, f"{target}/run-1", str(target), "/ckpt", True)
        assert local.mounts[1] == a.mounts[1]  # a drive of this machine is left as it is
        exports.stop()  # gpu-01's server went away
        with pytest.raises(nfs.NfsMountError, match=rf"^cannot mount drive ft-ckpt from gpu-01 "
                                                    rf"\({nets.host('gpu-01')}\) over NFS/TCP: the server refused NFS "
                                                    rf"on port {exports.port}: Connection refused$"):
            mounts.local(a)
        assert mounts.mounted() == {str(target)}  # still there for the worker that runs on it
        mounts.release(lambda: {str(target)}, lambda f, *args: f(*args))
        assert mounts.mounted() == {str(target)}
        mounts.release(lambda: set(), lambda f, *args: f(*args))  # its last worker ended
        assert mounts.mounted() == set() and not target.exists()
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


@needs_ganesha
def test_kernel_mount(nets, exports, tmp_path):
    """The real `mount -t nfs4` from another namespace, through astraeus.agent.nfs.mount; only where the kernel has
    an NFS client (this host's has none)."""
    if not ({"nfs", "nfs4"} & nfs._filesystems()):
        pytest.skip("this kernel has no NFS client (/proc/filesystems lists no nfs): the kernel mount is not tested "
                    "here")
    nets.add("gpu-02")
    root = tmp_path / "d"
    root.mkdir()
    e = P.Export(drive=f"{NS}.ft-ckpt", path=str(root), clients=[nets.addr("gpu-02")], create=True)
    assert exports.apply([e]) == {}
    uid, _ = nfs.workspace_ids(e.drive, None)
    target = tmp_path / "mnt"
    code = (
        "import os, sys\n"
        "from astraeus import protocol as P\nfrom astraeus.agent import nfs\n"
        f"src = P.NfsSource(server='{nets.host('gpu-02')}', machine='gpu-01', export_path='/', port={exports.port})\n"
        f"nfs.mount(src, '{target}', deadline=20, drive='{e.drive}')\n"
        f"open('{target}/step-1.pt', 'w').write('w1')\n"
        f"st = os.stat('{target}/step-1.pt')\n"
        "print('owner', st.st_uid)\n"
        f"assert nfs.unmount('{target}')\n")
    r = nets.run("gpu-02", sys.executable, "-c", code, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"owner {uid}" in r.stdout
    assert (root / "step-1.pt").read_text() == "w1"


# ------------------------------------------------------------------------------------------------ a cluster
@needs_ganesha
@pytest.mark.faults
def test_keeping_machine_exports_to_the_worker_machine_while_it_uses_the_drive(tmp_path):
    """`astraeus up --machines 2 --netns`: gpu-01 keeps drive ft-ckpt; a run placed on gpu-02 uses it. gpu-02 says
    it can mount NFS (ASTRAEUS_NFS_CLIENT=true: this kernel cannot, so the worker cannot start, and says why).
    While the worker is placed, gpu-01 exports the folder to gpu-02's address only, and the export is read from
    gpu-02's namespace with nfs-cat from a privileged port (refused from an unprivileged one, as a worker's would
    be whatever address it leaves with); once the worker ended, gpu-01 exports nothing; and an agent that exits while it
    exports stops its server."""
    from astraeus.fleet import netns as fleet

    home = tmp_path / "home"
    out = Path("/data/astraeus") / f"test-nfs-{uuid.uuid4().hex[:12]}"
    c = start_cluster(home, machines=2, gpus=1, extra_args=["--netns"], env={"ASTRAEUS_NFS_CLIENT": "true"})
    layout = fleet.load(home)
    g1, g2 = layout.machine("gpu-01"), layout.machine("gpu-02")
    nft = ["nsenter", f"--net=/run/netns/{g2.netns}", "nft"]
    try:
        with c.client() as api:
            drive = {"metadata": {"name": "ft-ckpt"}, "spec": {"sources": [
                {"node": "gpu-01", "path": str(out), "mount_path": "/ckpt", "mode": "ReadWrite"}],
                "permissions": {"create": True}, "transport": "Auto"}}
            r = api.post("/drives", json=drive)
            assert r.status_code == 201, r.text
            # A partial network fault for the length of the test: gpu-02's root (its agent) gets no answer from
            # gpu-01's NFS port, so its mount waits for the deadline and the worker stays placed meanwhile; the
            # test reads the export from gpu-02 as another user given CAP_NET_BIND_SERVICE (a privileged port).
            subprocess.run([*nft, "add table inet bnfs; add chain inet bnfs out { type filter hook output priority 0; }; "
                            f"add rule inet bnfs out ip daddr {g1.address} tcp dport 2049 meta skuid 0 drop"],
                           check=True, capture_output=True, text=True)
            run = {"metadata": {"name": "trainer"}, "spec": {"task_template": {
                "image": "python:3.11", "command": "python", "args": ["-c", "print('never')"],
                "restart_policy": "Never", "datavolume_refs": [{"name": "ft-ckpt", "mount_path": "/ckpt"}],
                "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 28, "gpu_requests": {"count": 1},
                                        "node_selection": {"mode": "Names", "names": ["gpu-02"]}}}}}
            r = api.post("/runs", json=run)
            assert r.status_code == 201, r.text
            # gpu-01 made the folder (handed to the workspace's user) and exports it to gpu-02
            wait_for(lambda: out.is_dir() and "NFS exports: " in (home / "agent-gpu-01.log").read_text(),
                     timeout=30, what="gpu-01's export")
            conf = (home / "agents" / "gpu-01" / "nfs-server" / "ganesha.conf").read_text()
            assert f"Clients = {g2.address}; Access_Type = RW;" in conf and conf.count("CLIENT {") == 1
            owner = out.stat().st_uid
            os.chown(out, owner, owner)
            (out / "step-3.pt").write_text("weights\n")
            os.chown(out / "step-3.pt", owner, owner)
            ns = _workspace_ns(conf)
            as_owner = ["nsenter", f"--net=/run/netns/{g2.netns}", "setpriv", f"--reuid={owner}", f"--regid={owner}",
                        "--clear-groups"]
            bind_cap = ["--inh-caps=+net_bind_service", "--ambient-caps=+net_bind_service"]
            file = f"nfs://{g1.address}/astraeus/{ns}.ft-ckpt/step-3.pt?version=4"
            read = subprocess.run([*as_owner, *bind_cap, "nfs-cat", file], capture_output=True, text=True,
                                  timeout=30)
            assert read.returncode == 0 and read.stdout == "weights\n", read.stderr
            # from gpu-02's address but an unprivileged port (a worker's, with egress `all` or host network): refused
            worker = subprocess.run([*as_owner, "nfs-cat", file + "&uid=0&gid=0"], capture_output=True, text=True,
                                    timeout=30)
            assert worker.returncode != 0 and "weights" not in worker.stdout, worker.stdout
            # the worker's reason names the machine it could not reach
            w = wait_for(lambda: (lambda x: x if x.get("state") == "Failed" else None)(c.worker("trainer-0")),
                         timeout=60, what="the worker to fail")
            assert f"cannot mount drive ft-ckpt from gpu-01 ({g1.address}) over NFS/TCP: the server did not answer " \
                   "within 20 s" in str(w), w
            # its last worker elsewhere ended: gpu-01 exports nothing, and its NFS server is gone
            wait_for(lambda: not (home / "agents" / "gpu-01" / "nfs-server" / "ganesha.conf").exists(), timeout=30,
                     what="gpu-01 to unexport")
            log = (home / "agent-gpu-01.log").read_text()
            assert f"{ns}.ft-ckpt ({out} as /astraeus/{ns}.ft-ckpt) to {g2.address}" in log
            assert "stopping the NFS server" in log
            gone = subprocess.run([*as_owner, *bind_cap, "nfs-ls", f"nfs://{g1.address}/astraeus/{ns}.ft-ckpt?version=4"],
                                  capture_output=True, text=True, timeout=30)
            assert gone.returncode != 0

            # another worker there: exported again; the cluster stops meanwhile, and gpu-01's agent stops its server
            run["metadata"]["name"] = "trainer-2"
            assert api.post("/runs", json=run).status_code == 201
            wait_for(lambda: (home / "agent-gpu-01.log").read_text().count("NFS exports: ") == 2, timeout=30,
                     what="gpu-01 to export again")
            conf_path = str(home / "agents" / "gpu-01" / "nfs-server" / "ganesha.conf")
            assert len(ganesha_pids(conf_path)) == 1
        c.stop()
        assert ganesha_pids(conf_path) == [] and not os.path.exists(conf_path)
        assert (home / "agent-gpu-01.log").read_text().count("stopping the NFS server") == 2
    finally:
        subprocess.run([*nft, "delete table inet bnfs"], capture_output=True)
        c.stop()
        shutil.rmtree(out, ignore_errors=True)


def _workspace_ns(conf: str) -> str:
    """The workspace's namespace, from the pseudo path of the one export in a Ganesha config."""
    line = next(ln for ln in conf.splitlines() if 'Pseudo = "/astraeus/' in ln)
    return line.split('Pseudo = "/astraeus/')[1].split(".ft-ckpt")[0]


# ------------------------------------------------------------------------------------------------ the machine
def test_what_this_machine_says_it_can_do(monkeypatch):
    monkeypatch.delenv("ASTRAEUS_NFS_CLIENT", raising=False)
    a = nfs.nfs_ability()
    assert a.server == ("ganesha" if shutil.which("ganesha.nfsd") and nfs.ganesha_plugins_dir() else None)
    kernel = {"nfs", "nfs4"} & nfs._filesystems()
    if not kernel and not os.path.isdir(f"/lib/modules/{os.uname().release}"):
        assert a.client is False  # this host: no NFS in the kernel, no modules to load
    if kernel:
        assert a.client is True
    monkeypatch.setenv("ASTRAEUS_NFS_CLIENT", "true")  # an operator who knows the first mount loads the module
    assert nfs.nfs_ability().client is True
    monkeypatch.setenv("ASTRAEUS_NFS_CLIENT", "false")
    assert nfs.nfs_ability().client is False


def test_a_bad_nfs_port_says_what_to_change(monkeypatch, tmp_path):
    monkeypatch.setenv("ASTRAEUS_NFS_PORT", "nfs")
    with pytest.raises(nfs.ExportError, match=r"NFS port 'nfs' \(ASTRAEUS_NFS_PORT\) is not a port: give one in "
                                              r"1-65535, or leave it unset for 2049"):
        nfs.Exports(str(tmp_path))
