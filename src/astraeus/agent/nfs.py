"""Drives across machines over NFS: what this machine can do (`nfs_ability`), its exports (`Exports`, through
NFS-Ganesha), and the mounts of drives kept on other machines (`mount`/`unmount`, each in a child with a deadline).

The keeping machine (the one whose folder holds a drive's bytes) exports the folder over NFSv4 to exactly the
machines that run the drive's workers elsewhere (`Assignments.exports`, computed by the control plane): one
`ganesha.nfsd` per agent, with its own config, pid file, log and recovery folder under `<state_dir>/nfs-server/`,
listening on its own port (`ASTRAEUS_NFS_PORT`, default 2049). A ReadWrite folder that is root's and new (or
empty) is handed to the drive's workspace user first, as a worker on the keeping machine would. The folder is opened
inside its granted root without following a symlink out of it (mounts.open_drive_dir), and exported at
`/astraeus/<ns>.<drive>` in the server's NFSv4 namespace (`pseudo_path`: flat, so two drives never nest whatever
their folders are; the mounting agent computes the same path). A changed list is applied by rewriting the config and
SIGHUP (Ganesha 4 re-reads its exports, adding, changing and removing them); the server is stopped once nothing is
exported, and on agent shutdown. A server left behind by a crashed agent (its pid file) is stopped when the next
agent starts, and a new one started for the exports the control plane gives it. Graceless: a restarted server has
no 90 s grace period (clients re-open their files; there are no NFSv4 locks to reclaim worth blocking every worker
for).

What an export trusts. AUTH_SYS (`SecType = sys`) authenticates nobody: a client states a uid and gids, and any
process that reaches the server can state any. So an export trusts only what an unprivileged process cannot choose:
- **the client's address**: every export is `Access_Type = None` for everybody but its CLIENT block, which grants
  RW (RO for a ReadOnly drive) to the addresses of the machines that run the drive's workers, and nobody else;
- **a privileged source port** (`PrivilegedPort = true` in every EXPORT and in EXPORT_DEFAULTS): a request from a
  port >= 1024 is refused as if its address were not listed. Only root (or a process with CAP_NET_BIND_SERVICE)
  binds one: the mounting agent's kernel mount does (`resvport`: mount_options); a worker cannot (no capabilities,
  and ports below 1024 are not bindable in its own network namespace nor in the machine's), even where its traffic
  leaves with the machine's address (`ASTRAEUS_WORKER_EGRESS=all`, `network: host`);
- **no uid at all**: `Squash = All_Squash` maps every uid and gid a client states, root's included, to the drive's
  workspace user (`Anonymous_Uid/Gid` = the workspace's uid, the uid its workers run as on every machine:
  astraeus.agent.runtime.mounts), so the mounting agent, the worker's shim and the worker all act as that user on
  the drive, and whatever is written through NFS is that user's.
What is left: root on a listed machine can act as the drive's owner on that drive (as it can through the agent's
mount there anyway). Kerberos (`SecType = krb5p`) would authenticate machines; the agent does not configure it
(docs/fleet.md says how a site that has it would).
The pseudo-root shows a client only the exports it may use: Ganesha leaves the junction of an export the client has
no access to (address not listed, or an unprivileged port) out of a READDIR of `/astraeus` and answers a LOOKUP of
it with NOENT, so another workspace's drive name is shown to nobody but the root of the machines that run its
workers (tests/fleet/test_nfs.py checks it).

A worker on another machine gets a Mount with `nfs` set: the agent mounts `server:/export_path` with `mount -t nfs4
-o mount_options(...)` under `<state_dir>/nfs/<ns>.<drive>` (shared by that drive's workers on the machine,
unmounted when none uses it) and binds it into the worker like any drive. Mounting runs in a child process with a
deadline: first it asks the server an NFS NULL call over TCP (so a server that does not answer is told apart from
one that refuses), then runs mount(8). A child past its deadline is killed and the target lazily unmounted; the
error (`NfsMountError`) names the drive, the machine, its address and the transport, and becomes the worker's
StartFailed reason.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import psutil

from astraeus import protocol as P

log = logging.getLogger("astraeus.agent.nfs")

GANESHA = "ganesha.nfsd"
GANESHA_PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/ganesha", "/usr/lib/aarch64-linux-gnu/ganesha",
                       "/usr/lib/powerpc64le-linux-gnu/ganesha", "/usr/lib64/ganesha", "/usr/lib/ganesha")
MOUNT_DEADLINE = 20.0  # seconds a mount may take before the worker's start fails
UNMOUNT_DEADLINE = 10.0


# ------------------------------------------------------------------------------------------ what this machine has
def ganesha_plugins_dir(dirs: tuple[str, ...] = GANESHA_PLUGIN_DIRS) -> str | None:
    """The folder holding Ganesha's VFS FSAL (libfsalvfs.so), or None when it is not installed."""
    for d in dirs:
        if os.path.exists(os.path.join(d, "libfsalvfs.so")):
            return d
    return None


def _filesystems(path: str = "/proc/filesystems") -> set[str]:
    try:
        with open(path) as f:
            return {line.split()[-1] for line in f if line.strip()}
    except OSError:
        return set()


def _module_available(name: str) -> bool:
    """A kernel module file (or a built-in) named `name` for the running kernel."""
    release = os.uname().release
    base = os.path.join("/lib/modules", release)
    try:
        with open(os.path.join(base, "modules.builtin")) as f:
            if any(os.path.basename(line.strip()).split(".ko")[0] == name for line in f):
                return True
    except OSError:
        pass
    try:
        with open(os.path.join(base, "modules.dep")) as f:
            return any(os.path.basename(line.split(":", 1)[0]).split(".ko")[0] == name for line in f)
    except OSError:
        return False


def kernel_nfs_client() -> bool:
    """The kernel can mount nfs4: it lists nfs4 (or nfs) in /proc/filesystems, or mount.nfs4 is installed and the
    nfsv4 module can be loaded (it is loaded by the first mount). `ASTRAEUS_NFS_CLIENT=true|false` overrides
    what is found (an operator who knows better; "auto", the default, finds out)."""
    from astraeus.settings import agent_settings

    said = agent_settings().nfs_client
    if said in ("1", "true", "yes"):
        return True
    if said in ("0", "false", "no"):
        return False
    fs = _filesystems()
    if "nfs4" in fs or "nfs" in fs:
        return True
    return bool(shutil.which("mount.nfs4")) and _module_available("nfsv4")


def nfs_ability() -> P.NfsAbility:
    """What this machine can do for drives across machines: export with NFS-Ganesha ("ganesha": ganesha.nfsd and
    its VFS FSAL installed), mount NFSv4 (client), and NFS over RDMA (a device in /sys/class/infiniband). A machine
    that exports reports no RDMA: the agent serves NFS over TCP only (Debian's Ganesha has no NFS/RDMA transport),
    and `Auto` must not pick RDMA for a drive it keeps. (The kernel's nfsd is not used: a machine with only it
    reports no server, and the drives it keeps are used there only.)"""
    server = "ganesha" if shutil.which(GANESHA) and ganesha_plugins_dir() else None
    try:
        rdma = bool(os.listdir("/sys/class/infiniband")) and server is None
    except OSError:
        rdma = False
    return P.NfsAbility(server=server, client=kernel_nfs_client(), rdma=rdma)


# ------------------------------------------------------------------------------------------------ pure rules
class ExportError(ValueError):
    """An export that cannot be made; str(e) says which and why."""


_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                   r"[A-Za-z0-9])?)*$")


def check_client(addr: str) -> str:
    """An address (IPv4/IPv6) or host name a drive may be exported to; ExportError otherwise."""
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        pass
    if _HOST.match(addr or ""):
        return addr
    raise ExportError(f"cannot export to {addr!r}: not an address or a host name")


def check_path(path: str) -> str:
    if not path or not os.path.isabs(path):
        raise ExportError(f"cannot export {path!r}: the folder must be an absolute path")
    if any(c in path for c in '"\\\n\r\0{};#') or ".." in path.split("/"):
        raise ExportError(f"cannot export {path!r}: the path holds a character or '..' that an export refuses")
    norm = os.path.normpath(path)
    if norm == "/":
        raise ExportError("cannot export / (a drive's folder is a folder below the root)")
    return norm


_DRIVE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*\.[A-Za-z0-9][A-Za-z0-9._-]*$")


def pseudo_path(drive: str) -> str:
    """Where drive "<ns>.<name>" is in the keeping machine's NFSv4 namespace (pure; both sides compute it): one
    flat folder per drive, so that two drives never nest whatever their folders are."""
    if not _DRIVE.match(drive or "") or len(drive) > 200:
        raise ExportError(f"cannot export drive {drive!r}: a drive is named <workspace ns>.<name>")
    return f"/astraeus/{drive}"


def mount_options(transport: str, port: int, read_only: bool = False, timeo: int = 100, retrans: int = 3) -> str:
    """mount(8) options for an NFS drive (pure): NFSv4.2, `proto=tcp` or `proto=rdma` (the control plane chose it
    with drives.choose_transport: RDMA on port 20049 when both machines have RDMA, else TCP on 2049), `hard` (a
    checkpoint is never half-written silently: I/O waits for the server), `resvport` (a privileged source port, which
    every export requires; said, so that a site's nfsmount.conf cannot turn it off), timeo in tenths of a second."""
    if transport not in ("tcp", "rdma"):
        raise ValueError(f"unknown NFS transport {transport!r}: tcp or rdma")
    if not 0 < int(port) < 65536:
        raise ValueError(f"NFS port {port} is not a port (1-65535)")
    opts = ["vers=4.2", f"proto={transport}", f"port={int(port)}", "hard", "resvport", f"timeo={int(timeo)}",
            f"retrans={int(retrans)}"]
    if read_only:
        opts.append("ro")
    return ",".join(opts)


def transport_label(transport: str) -> str:
    return "NFS/RDMA" if transport == "rdma" else "NFS/TCP"


def workspace_ids(drive: str, number: int | None) -> tuple[int, int]:
    """(uid, gid) of the workspace that owns `drive` ("<ns>.<name>"): the user its workers run as on every machine
    (ASTRAEUS_WORKER_USER, or the workspace's own uid: astraeus.agent.runtime.mounts)."""
    from astraeus.agent.runtime import mounts
    from astraeus.settings import agent_settings
    from astraeus.users import resolve_user

    s = agent_settings()
    if s.worker_user:
        return resolve_user(s.worker_user)
    uid = mounts.workspace_uid(drive.partition(".")[0], number, s.worker_uid_base, s.worker_uid_range)
    return uid, uid


def workspace_owner(uid: int) -> dict | None:
    """The drive's owner as mounts.open_drive_dir checks it (a folder of another workspace's uid is refused); None
    with one user for every workspace (ASTRAEUS_WORKER_USER)."""
    from astraeus.settings import agent_settings

    s = agent_settings()
    if s.worker_user:
        return None
    return {"uid": uid, "uids": [s.worker_uid_base, s.worker_uid_base + s.worker_uid_range]}


def ganesha_config(exports: list[dict], port: int, recovery_dir: str, plugins_dir: str, bind: str | None = None) \
        -> str:
    """Ganesha's config for `exports` (pure): each {"id", "path", "pseudo", "clients": {addr: "RW"|"RO"}, "uid",
    "gid"}.
    NFSv4 only, over TCP; no NLM, no RQUOTA, no UDP, no portmapper; every export closed to all but its CLIENT
    block, to a client's unprivileged port, and to every uid but the drive's owner (All_Squash to "uid"/"gid")."""
    core = [f"NFS_Port = {int(port)};", "Protocols = 4;", "Enable_NLM = false;", "Enable_RQUOTA = false;",
            "Enable_UDP = false;", f'Plugins_Dir = "{plugins_dir}";']
    if bind:
        core.append(f"Bind_addr = {bind};")
    out = ["# written by the Astraeus agent; rewritten whenever its exports change",
           "NFS_CORE_PARAM { " + " ".join(core) + " }",
           f'NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = "{recovery_dir}"; '
           "Minor_Versions = 0, 1, 2; }",
           "NFS_KRB5 { Active_krb5 = false; }",
           "EXPORT_DEFAULTS { Access_Type = None; PrivilegedPort = true; Squash = All_Squash; Anonymous_Uid = -2; "
           "Anonymous_Gid = -2; SecType = sys; Protocols = 4; }"]
    for e in exports:
        out.append("EXPORT {")
        out.append(f'    Export_Id = {int(e["id"])}; Path = "{e["path"]}"; Pseudo = "{e["pseudo"]}";')
        out.append("    Protocols = 4; Transports = TCP; SecType = sys; Access_Type = None; PrivilegedPort = true;")
        out.append(f"    Squash = All_Squash; Anonymous_Uid = {int(e['uid'])}; Anonymous_Gid = {int(e['gid'])};")
        out.append("    FSAL { Name = VFS; }")
        for mode in ("RW", "RO"):
            clients = sorted(a for a, m in e["clients"].items() if m == mode)
            if clients:
                out.append(f"    CLIENT {{ Clients = {', '.join(clients)}; Access_Type = {mode}; }}")
        out.append("}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- the exporter
def _pid_alive(pid: int) -> bool:
    """A process `pid` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [os.fsdecode(a) for a in f.read().split(b"\0") if a]
    except OSError:
        return []


class Exports:
    """This machine's NFS exports, through one ganesha.nfsd of its own (see the module's docstring).
    `apply(list)` makes the exports exactly that list; `stop()` ends the server."""

    def __init__(self, state_dir: str, port: int | None = None, bind: str | None = None,
                 start_timeout: float = 15.0):
        self.dir = os.path.join(os.path.abspath(state_dir), "nfs-server")
        if port is None:
            from astraeus.settings import SettingsError, agent_settings

            try:
                port = agent_settings().nfs_port
            except SettingsError as e:  # said below, as this server's own error
                port = e.values.get("ASTRAEUS_NFS_PORT")
                if port is None:
                    raise
        said = port
        try:
            self.port = int(said)
        except ValueError:
            self.port = 0
        if not 0 < self.port < 65536:
            raise ExportError(f"NFS port {said!r} (ASTRAEUS_NFS_PORT) is not a port: give one in 1-65535, or leave "
                              "it unset for 2049")
        self.bind = bind
        self.start_timeout = start_timeout
        self.conf = os.path.join(self.dir, "ganesha.conf")
        self.pid_file = os.path.join(self.dir, "ganesha.pid")
        self.log_file = os.path.join(self.dir, "ganesha.log")
        self.recovery = os.path.join(self.dir, "recovery")
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.ids: dict[str, int] = {}  # drive -> Export_Id, stable while the server runs
        self.applied: str | None = None  # the config the server runs with
        self.problems: dict[str, str] = {}  # drive -> why it is not exported
        self.replace_stale()

    # ---------------------------------------------------------------- the server process
    def _stale_pid(self) -> int | None:
        try:
            with open(self.pid_file) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            return None
        if pid <= 0 or not _pid_alive(pid):
            return None
        argv = _cmdline(pid)
        if not argv or os.path.basename(argv[0]) != GANESHA or self.conf not in argv:
            return None  # the pid was reused by something else
        return pid

    def replace_stale(self) -> None:
        """Stop a ganesha.nfsd left running with this state dir by an agent that crashed."""
        pid = self._stale_pid()
        if pid is not None and (self.proc is None or self.proc.pid != pid):
            log.info("stopping the NFS server (ganesha.nfsd pid %d) a previous agent left running", pid)
            self._terminate(pid)

    def _terminate(self, pid: int, grace: float = 5.0) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.pid == pid:
                if self.proc.poll() is not None:
                    return
            elif not _pid_alive(pid):
                return
            time.sleep(0.05)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if self.proc is not None and self.proc.pid == pid:
            self.proc.wait(5)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _log_size(self) -> int:
        try:
            return os.path.getsize(self.log_file)
        except OSError:
            return 0

    def _logged_since(self, offset: int, needle: str) -> bool:
        """Whether the server's log says `needle` after byte `offset`."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(offset)
                return needle.encode() in f.read()
        except OSError:
            return False

    def _log_tail(self, n: int = 6) -> str:
        try:
            with open(self.log_file, errors="replace") as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ":CRIT :" in ln or ":FATAL :" in ln
                         or ":MAJ :" in ln]
        except OSError:
            return ""
        return " | ".join(ln.split("] ", 1)[-1] for ln in lines[-n:])

    def _start(self) -> None:
        exe = shutil.which(GANESHA)
        if not exe or not ganesha_plugins_dir():
            raise ExportError("cannot export drives: NFS-Ganesha is not installed on this machine (Debian/Ubuntu: "
                              "apt-get install nfs-ganesha nfs-ganesha-vfs)")
        os.makedirs(self.dir, exist_ok=True)
        if self._log_size() > 0:  # one log per server: the previous one is kept as .1
            os.replace(self.log_file, self.log_file + ".1")
        self.proc = subprocess.Popen([exe, "-F", "-f", self.conf, "-L", self.log_file, "-p", self.pid_file,
                                      "-N", "NIV_EVENT"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                why = self._log_tail() or f"exit status {self.proc.returncode}"
                self.proc = None
                raise ExportError(f"the NFS server (ganesha.nfsd) did not start: {why} (log: {self.log_file})")
            if self._logged_since(0, "NFS SERVER INITIALIZED"):
                log.info("NFS server (ganesha.nfsd pid %d) listening on port %d", self.proc.pid, self.port)
                return
            time.sleep(0.05)
        pid, self.proc = self.proc.pid, self.proc
        self._terminate(pid)
        self.proc = None
        raise ExportError(f"the NFS server (ganesha.nfsd) did not start within {self.start_timeout:g} s "
                          f"(log: {self.log_file})")

    def _reload(self) -> None:
        offset = self._log_size()
        os.kill(self.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise ExportError(f"the NFS server (ganesha.nfsd) exited while re-reading its exports: "
                                  f"{self._log_tail()} (log: {self.log_file})")
            if self._logged_since(offset, "Reread exports complete"):
                return
            time.sleep(0.05)
        raise ExportError(f"the NFS server did not re-read its exports within {self.start_timeout:g} s")

    def stop(self) -> None:
        """Stop the server (nothing is exported any more)."""
        with self.lock:
            self._stop()

    def _stop(self) -> None:
        if self.proc is not None:
            log.info("stopping the NFS server (ganesha.nfsd pid %d): nothing is exported", self.proc.pid)
            self._terminate(self.proc.pid)
            self.proc = None
        else:
            self.replace_stale()
        self.applied = None
        self.ids.clear()
        for p in (self.pid_file, self.conf):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    # ---------------------------------------------------------------- the exports
    def _prepare(self, e: P.Export) -> tuple[str, int, int]:
        """Check one export and open its folder (inside its granted root, never through a symlink); hand a new or
        empty root-owned ReadWrite folder to the workspace's user. (path, uid, gid)."""
        from astraeus.agent.runtime import mounts

        path = check_path(e.path)
        try:
            uid, gid = workspace_ids(e.drive, getattr(e, "workspace_number", None))
        except ValueError as err:
            raise ExportError(f"cannot export drive {e.drive}: {err}") from None
        try:
            fd = mounts.open_drive_dir(path, e.granted_root, bool(e.create) and not e.read_only, workspace_owner(uid))
        except mounts.MountError as err:
            raise ExportError(f"cannot export drive {e.drive}: {err}") from None
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
            if os.path.normpath(real) != path:
                raise ExportError(f"cannot export drive {e.drive}: {path} resolves to {real} (a symlink on the way "
                                  "to the granted host path)")
            if not e.read_only:
                mounts.hand_over(fd, uid, gid, bool(e.create))
        finally:
            os.close(fd)
        return path, uid, gid

    def plan(self, exports: list[P.Export]) -> list[dict]:
        """The exports Ganesha gets for `exports` (the folders opened and checked now). One that cannot be made is
        left out, and why is in self.problems (and the log)."""
        planned: dict[str, dict] = {}
        self.problems = {}
        for e in exports:
            try:
                pseudo = pseudo_path(e.drive)
                clients = [check_client(c) for c in e.clients]
                if not clients:
                    continue
                path, uid, gid = self._prepare(e)
            except (ExportError, OSError) as err:
                self.problems[e.drive] = str(err)
                log.warning("%s", err)
                continue
            mode = "RO" if e.read_only else "RW"
            planned[e.drive] = {"drive": e.drive, "path": path, "pseudo": pseudo, "uid": uid, "gid": gid,
                                "clients": {c: mode for c in clients}}
        used = {self.ids[d] for d in planned if d in self.ids}
        for d in sorted(planned):
            if d not in self.ids:
                n = 1
                while n in used:
                    n += 1
                self.ids[d] = n
                used.add(n)
            planned[d]["id"] = self.ids[d]
        for d in [d for d in self.ids if d not in planned]:
            del self.ids[d]
        return [planned[d] for d in sorted(planned)]

    def apply(self, exports: list[P.Export]) -> dict[str, str]:
        """Make this machine's exports exactly `exports`. Returns the drives that could not be exported, and why."""
        with self.lock:
            planned = self.plan(exports)
            if not planned:
                if self.proc is not None or self._stale_pid() is not None:
                    self._stop()
                return dict(self.problems)
            plugins = ganesha_plugins_dir()
            if not plugins or not shutil.which(GANESHA):
                raise ExportError("cannot export drives: NFS-Ganesha is not installed on this machine "
                                  "(Debian/Ubuntu: apt-get install nfs-ganesha nfs-ganesha-vfs)")
            os.makedirs(self.recovery, mode=0o700, exist_ok=True)
            os.chmod(self.dir, 0o700)
            conf = ganesha_config(planned, self.port, self.recovery, plugins, self.bind)
            if conf == self.applied and self.running():
                return dict(self.problems)
            tmp = self.conf + ".tmp"
            with open(tmp, "w") as f:
                f.write(conf)
            os.replace(tmp, self.conf)
            if self.running():
                self._reload()
            else:
                self.proc = None
                self.replace_stale()
                self._start()
            self.applied = conf
            log.info("NFS exports: %s", "; ".join(f"{x['drive']} ({x['path']} as {x['pseudo']}) to "
                                                   f"{', '.join(sorted(x['clients']))}" for x in planned))
            return dict(self.problems)


# ------------------------------------------------------------------------------------------------ the client
class NfsMountError(Exception):
    """A drive kept on another machine could not be mounted; str(e) is the worker's StartFailed reason."""


def _rpc_null(server: str, port: int, timeout: float | None) -> None:
    """An NFSv4 NULL call over TCP (program 100003, version 4, procedure 0, AUTH_NONE): returns when the server
    answered; OSError when it refused or closed the connection."""
    with socket.create_connection((server, port), timeout=timeout) as s:
        s.settimeout(timeout)
        xid = int(time.time() * 1000) & 0xFFFFFFFF
        call = struct.pack(">IIIIIIIIII", xid, 0, 2, 100003, 4, 0, 0, 0, 0, 0)
        s.sendall(struct.pack(">I", 0x80000000 | len(call)) + call)
        head = b""
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            if not chunk:
                raise ConnectionResetError(104, "the server closed the connection")
            head += chunk
        n = struct.unpack(">I", head)[0] & 0x7FFFFFFF
        body = b""
        while len(body) < min(n, 64):
            chunk = s.recv(n - len(body))
            if not chunk:
                raise ConnectionResetError(104, "the server closed the connection")
            body += chunk
        if len(body) < 8 or struct.unpack(">I", body[:4])[0] != xid:
            raise OSError(71, "the answer is not an RPC reply to the call")


def _child_mount(args: dict) -> int:
    """In the mounting child: ask the server (TCP), then mount(8). Prints "answered" once the server answered, and
    the error's words last; exit status 0 when mounted."""
    if args["transport"] == "tcp":
        try:
            _rpc_null(args["server"], args["port"], None)
        except OSError as e:
            print(f"error: the server refused NFS on port {args['port']}: {e.strerror or e}", flush=True)
            return 2
        print("answered", flush=True)
    if args.get("probe_only"):
        return 0
    r = subprocess.run(["mount", "-t", "nfs4", "-o", args["options"], args["spec"], args["target"]],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if r.returncode != 0:
        words = (r.stderr or r.stdout).strip().splitlines()
        why = words[-1] if words else f"mount exited with status {r.returncode}"
        if not ({"nfs4", "nfs"} & _filesystems()):
            why += " (this machine's kernel has no NFS client: /proc/filesystems lists no nfs4)"
        print(f"error: {why}", flush=True)
        return 3
    return 0


def _mounted(target: str) -> bool:
    target = os.path.realpath(target)
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4].replace("\\040", " ") == target for line in f)
    except OSError:
        return False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def mount(source: P.NfsSource, target: str, deadline: float = MOUNT_DEADLINE, *, drive: str = "",
          read_only: bool = False) -> None:
    """Mount drive `drive` ("<ns>.<name>") from `source` at `target` (made if missing) in a child with `deadline`
    seconds; a child past it is killed and the target lazily unmounted. NfsMountError says why, naming the machine.
    The server's path is the drive's pseudo path (source.export_path when no drive is named)."""
    os.makedirs(target, mode=0o755, exist_ok=True)
    already = _mounted(target)  # another worker of the drive mounted it: ask the server whether it still answers
    if already and source.transport != "tcp":
        return
    what = (f"cannot mount drive {drive.partition('.')[2] or drive or source.export_path} from "
            f"{source.machine or source.server} ({source.server}) over {transport_label(source.transport)}")
    server = source.server
    host = f"[{server}]" if ":" in server else server
    args = {"server": server, "port": source.port, "transport": source.transport, "target": target,
            "spec": f"{host}:{pseudo_path(drive) if drive else source.export_path}",
            "options": mount_options(source.transport, source.port, read_only), "probe_only": already}
    proc = subprocess.Popen([sys.executable, "-c", "import sys, json; from astraeus.agent.nfs import _child_mount; "
                             "sys.exit(_child_mount(json.loads(sys.argv[1])))", json.dumps(args)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, _ = proc.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError):
            out = ""
        if not already:
            unmount(target, UNMOUNT_DEADLINE)
        if "answered" in out:
            raise NfsMountError(f"{what}: the mount did not complete within {deadline:g} s") from None
        raise NfsMountError(f"{what}: the server did not answer within {deadline:g} s") from None
    if proc.returncode != 0:
        if not already:
            unmount(target, UNMOUNT_DEADLINE)
        errs = [ln[len("error: "):] for ln in out.splitlines() if ln.startswith("error: ")]
        raise NfsMountError(f"{what}: {errs[-1] if errs else (out.strip() or f'exit status {proc.returncode}')}")


def unmount(target: str, deadline: float = UNMOUNT_DEADLINE) -> bool:
    """Lazily unmount `target` (in a child with a deadline) and remove the folder; True when it is no longer
    mounted."""
    if _mounted(target):
        try:
            subprocess.run(["umount", "-l", target], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=deadline, start_new_session=True)
        except subprocess.TimeoutExpired:
            log.warning("unmounting %s did not finish within %g s", target, deadline)
    if _mounted(target):
        return False
    try:
        os.rmdir(target)
    except OSError:
        pass
    return True


class NfsMounts:
    """The drives this machine mounts from others, under `<state_dir>/nfs/<ns>.<drive>` (`.ro` for a ReadOnly use):
    one mount per drive, shared by the machine's workers of that drive, unmounted once none of them runs."""

    def __init__(self, state_dir: str, deadline: float = MOUNT_DEADLINE):
        self.root = os.path.join(os.path.abspath(state_dir), "nfs")
        self.deadline = deadline
        self.lock = threading.Lock()
        self.target_locks: dict[str, threading.Lock] = {}
        self.unmounting: set[str] = set()

    def target(self, a: P.Assignment, m: P.Mount) -> str:
        return os.path.join(self.root, f"{a.workspace}.{m.drive}" + (".ro" if m.read_only else ""))

    def targets(self, a: P.Assignment) -> set[str]:
        return {self.target(a, m) for m in a.mounts if m.nfs is not None}

    def _lock(self, target: str) -> threading.Lock:
        with self.lock:
            return self.target_locks.setdefault(target, threading.Lock())

    def local(self, a: P.Assignment) -> P.Assignment:
        """`a` with each of its NFS drives mounted here and bound from that folder (host_path below it); the
        assignment as is when it has none. NfsMountError (the worker's StartFailed reason) when one cannot be."""
        if not any(m.nfs is not None for m in a.mounts):
            return a
        out = []
        for m in a.mounts:
            if m.nfs is None:
                out.append(m)
                continue
            target = self.target(a, m)
            with self._lock(target):
                os.makedirs(self.root, mode=0o700, exist_ok=True)
                mount(m.nfs, target, self.deadline, drive=f"{a.workspace}.{m.drive}", read_only=m.read_only)
            host = os.path.join(target, m.host_path.lstrip("/")).rstrip("/") if m.host_path.strip("/") else target
            out.append(m.model_copy(update={"nfs": None, "host_path": host, "granted_root": target}))
        return a.model_copy(update={"mounts": out})

    def mounted(self) -> set[str]:
        """The folders under <state_dir>/nfs mounted now."""
        prefix = self.root + "/"
        try:
            with open("/proc/self/mountinfo") as f:
                points = {line.split()[4].replace("\\040", " ") for line in f}
        except OSError:
            return set()
        return {p for p in points if p.startswith(prefix) and "/" not in p[len(prefix):]}

    def release(self, needed, submit) -> None:
        """Unmount (through `submit`, in the background) every drive mounted here that no worker needs: `needed()`
        says which are (asked again, under the drive's lock, just before unmounting one)."""
        mounted = self.mounted()
        if not mounted:
            return
        for target in mounted - needed():
            with self.lock:
                if target in self.unmounting:
                    continue
                self.unmounting.add(target)
            submit(self._unmount, target, needed)

    def _unmount(self, target: str, needed) -> None:
        try:
            with self._lock(target):
                if target in needed():
                    return
                log.info("unmounting %s: no worker here uses it any more", target)
                unmount(target)
        finally:
            with self.lock:
                self.unmounting.discard(target)

    def unmount_all(self) -> None:
        for target in self.mounted():
            unmount(target)
