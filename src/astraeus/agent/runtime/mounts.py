"""The worker's own view of the machine, and the unprivileged user it runs as (stdlib only: ctypes around libc).

Workers are never root on the host. The shim's child (the PID 1 of the worker's own PID namespace) builds the
worker's view in its own mount namespace, then forks the command, which drops to the workspace's user:

- the view's root is a fresh tmpfs holding a recursive bind of each of the host's system folders (SHOWN: /usr,
  /etc, /opt, /lib*, /bin, /sbin, /sys), every one of them read-only, and an empty folder for each other top-level
  folder (/home, /data, /mnt, /srv, /var ...: no granted host path nor drive folder of any workspace shows, as in a
  container, which has its image and its own drives only); /dev holds the usual nodes and the GPUs' (not
  /dev/fuse, /dev/net/tun, ...); /proc is a new proc for the worker's PID namespace (no other process is
  visible); /tmp and /dev/shm are private, empty and writable, /dev/mqueue is its own IPC namespace's; /root, the
  agent's state dir (every worker's folder, spec and log) and the Astraeus home (`env` with tokens, the SQLite
  database) are empty tmpfs;
- drives and configs are bind mounts inside that view. Their mount points are made in the view only: a missing
  entry in a host folder is made by "exploding" that folder there (a tmpfs over it holding a bind of each of
  its entries, plus the new one), so no path a spec names creates anything on the host. A ReadOnly drive is
  read-only at its mount path (its host path does not show);
- the worker's working folder (`work/` in its attempt's folder) is bound at its own path and owned by it.

The host's part (the new root, the pivot, the read-only remounts, the host's tree let go of) is the same for every
worker of a machine and costly (pivot_root and the unmount wait in the kernel, serialised across concurrent
starts): the shim launcher prepares it once (prepare_template: a mount namespace held by a descriptor, made again
when the host's mounts or top-level entries change) and each worker's PID 1 enters a copy of it, then mounts its
own /proc, /tmp, /root, /dev/shm, hidden paths and binds (WorkerView(template=...): sources cloned by open_tree in
the host's namespace, attached by move_mount). The prepared root is shared and never written: a view that needs a
new entry in / is built from scratch (NeedFresh), as is every view without the launcher.

Drives are resolved WITHOUT following symlinks: every component below the granted root is opened with
O_PATH|O_NOFOLLOW|O_DIRECTORY, and the final descriptor is bind-mounted through /proc/self/fd/N, so a symlink
swapped in between the check and the mount cannot redirect it. A ReadWrite drive's host folder is handed over
to the workspace's user (owner uid:gid, mode 0700) when it is owned by root and either `create` is set or it
is empty; otherwise it keeps its owner and mode (files in it stay readable across attempts: one uid per
workspace). A folder another workspace owns is never handed over (a new workspace, e.g. of a new cluster, is a
new owner: remove or chown such a folder), and a drive in it is refused: a folder below the granted root on the
way to the drive, or the drive's own, owned by another workspace's uid fails the start before anything is made
below it; nothing is made without a granted root. A host folder on the way to the working folder that the worker may
not search (0700, another owner) is covered by an empty tmpfs in the view.

The command runs as that user (setgroups([]), setresgid, setresuid), with an empty capability bounding set and
no capabilities (effective, permitted, inheritable, ambient), and no_new_privs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from astraeus.users import resolve_user

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203}

# libc from the symbols this process has loaded already (as the shim's LIBC): ctypes.util.find_library runs
# `ldconfig -p`, and ctypes.util's imports (subprocess, shutil ...) made every fork of the shim launcher dearer.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]

# open_tree(2) / move_mount(2) (Linux 5.2; the same numbers on every architecture): a drive's folder is cloned in
# the host's namespace and attached in a worker's view made from the prepared one (ViewTemplate).
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429
OPEN_TREE_CLONE = 1
AT_EMPTY_PATH = 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4

# The prepared view (ViewTemplate) this process may build workers' views from: (a descriptor of its mount
# namespace, the host's signature when it was made). Set in the shims the launcher forks; None elsewhere.
TEMPLATE: tuple[int, str] | None = None


class MountError(Exception):
    """A drive or config could not be set up; the message says which and why."""


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {source} on {target}: {os.strerror(e)}")


def setns(fd: int, nstype: int) -> None:
    if _libc.setns(fd, nstype) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns: {os.strerror(e)}")


def open_tree(fd: int) -> int:
    """A detached copy of the mount at `fd` (an O_PATH descriptor; not its submounts, as MS_BIND), which
    move_mount attaches in another mount namespace."""
    r = _libc.syscall(SYS_OPEN_TREE, fd, b"", OPEN_TREE_CLONE | AT_EMPTY_PATH | os.O_CLOEXEC)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"open_tree: {os.strerror(e)}")
    return r


def move_mount(tree: int, target: str) -> None:
    if _libc.syscall(SYS_MOVE_MOUNT, tree, b"", -100, _b(target), MOVE_MOUNT_F_EMPTY_PATH) != 0:  # AT_FDCWD
        e = ctypes.get_errno()
        raise OSError(e, f"move_mount on {target}: {os.strerror(e)}")


def unshare_mount_namespace() -> None:
    """Enter a new mount namespace whose mounts do not propagate back to the host."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise MountError(f"cannot create a mount namespace (unshare CLONE_NEWNS): {os.strerror(e)}; the agent must run as root")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def _components(path: str) -> list[str]:
    return [c for c in path.split("/") if c not in ("", ".")]


def open_drive_dir(host_path: str, granted_root: str | None, create: bool, owner: dict | None = None) -> int:
    """Open host_path (a directory under granted_root) without following any symlink below the root.

    Returns an O_PATH descriptor. With create, missing folders are made (mode 0755), only below the granted root:
    with no granted root (its grant was taken back) nothing is made. `owner`: the worker's isolation ({"uid",
    "uids": [first, end) of the machine's workspace uids}, as isolation_spec makes it): a folder on the way below
    the granted root, or the drive's own, owned by another workspace's uid is refused before anything is made
    below it (a folder of another workspace's drive is never made into, handed over nor mounted)."""
    if not os.path.isabs(host_path):
        raise MountError(f"drive path {host_path!r} is not absolute")
    root = granted_root or "/"
    if not os.path.isabs(root):
        raise MountError(f"granted host path {root!r} is not absolute")
    root = os.path.normpath(root)
    hp = os.path.normpath(host_path)
    if ".." in _components(host_path):
        raise MountError(f"drive path {host_path!r} may not contain '..'")
    rel = os.path.relpath(hp, root)
    if rel == ".":
        rel_parts: list[str] = []
    elif rel.startswith(".."):
        raise MountError(f"drive path {host_path} is outside the granted host path {root}")
    else:
        rel_parts = _components(rel)
    own, others = _owners(owner)
    if create and granted_root is not None:
        os.makedirs(root, exist_ok=True)  # the granted root is the admin's; it may be followed
    try:
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(f"granted host path {root}: {e.strerror}") from None
    walked = root
    try:
        for part in rel_parts:
            walked = os.path.join(walked, part)
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise MountError(f"drive path {walked} does not exist (the drive does not allow create)") from None
                if granted_root is None:
                    raise MountError(f"drive path {walked} does not exist, and no host path granted to the "
                                     "workspace holds it: nothing is made outside a grant") from None
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise MountError(f"drive path {walked} is a symlink; symlinks are refused in drive paths")
            if not stat.S_ISDIR(st.st_mode):
                raise MountError(f"drive path {walked} is not a directory")
            try:
                nfd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise MountError(f"drive path {walked} is a symlink; symlinks are refused in drive paths") from None
                raise MountError(f"drive path {walked}: {e.strerror}") from None
            os.close(fd)
            fd = nfd
            uid = os.fstat(fd).st_uid  # the folder opened, not the name: a swap after the check changes nothing
            if uid != own and uid in others:
                raise MountError(f"drive path {hp}: {walked} is a folder of another workspace; a drive may not be "
                                 "in it (choose a path outside it)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _owners(owner: dict | None) -> tuple[int | None, range]:
    """(the worker's uid, the uids of the machine's workspaces) from its isolation; nothing to check without it, or
    with one user for every workspace (ASTRAEUS_WORKER_USER: no uid tells workspaces apart)."""
    if not owner or owner.get("uid") is None or not owner.get("uids"):
        return None, range(0)
    first, end = (int(x) for x in owner["uids"])
    return int(owner["uid"]), range(first, end)


# ------------------------------------------------------------------------------------------- the worker's user
def workspace_of(worker: str, env: dict) -> str:
    """The worker's workspace namespace (`ws-<12 hex>`): from ASTRAEUS_JOB_NAME (`<ns>.<run>`) or its identity
    (`<ns>.<name>`); "" when neither names one."""
    job = str(env.get("ASTRAEUS_JOB_NAME") or "")
    if "." in job:
        return job.partition(".")[0]
    return worker.partition(".")[0] if "." in worker else ""


def workspace_uid(ns: str, number: int | None, base: int = 200000, span: int = 65536) -> int:
    """One uid per workspace: base + the workspace's number in the control plane (unique, so no two workspaces
    ever share a uid). Without a number (an assignment that names none) the uid is derived from the namespace's
    hex digits instead, which is unique only with high probability. A number outside the span is refused."""
    if number is not None:
        if not 0 < number < int(span):
            raise ValueError(f"workspace number {number} is outside ASTRAEUS_WORKER_UID_RANGE ({span}): "
                             "raise the range on this machine")
        return int(base) + int(number)
    import hashlib

    h = ns[3:] if ns.startswith("ws-") else ""
    try:
        n = int(h, 16) if h else int(hashlib.sha256(ns.encode()).hexdigest()[:12], 16)
    except ValueError:
        n = int(hashlib.sha256(ns.encode()).hexdigest()[:12], 16)
    return int(base) + n % int(span)


def isolation_spec(state_dir: str, worker: str, env: dict, workspace_number: int | None = None) -> dict:
    """What the shim needs to isolate a worker (written into spec.json by the agent): its uid/gid and the host
    paths its view hides. Read from AgentSettings (ASTRAEUS_WORKER_USER or ASTRAEUS_WORKER_UID_BASE/RANGE)."""
    from astraeus.settings import agent_settings  # the agent's side only: the shim never imports pydantic

    s = agent_settings()
    if s.worker_user:
        uid, gid = resolve_user(s.worker_user)
    else:
        uid = gid = workspace_uid(workspace_of(worker, env), workspace_number, s.worker_uid_base,
                                  s.worker_uid_range)
    hide = {os.path.realpath(state_dir), os.path.realpath(os.path.expanduser(str(s.home)))}
    parent = os.path.dirname(os.path.realpath(state_dir))
    home = os.path.dirname(parent)  # `astraeus up --home H` gives its agents --state-dir H/agents/<name>
    if os.path.basename(parent) == "agents" and any(os.path.exists(os.path.join(home, f)) for f in ("env", "astraeus.db")):
        hide.add(home)
    hide = sorted(hide)
    iso = {"uid": uid, "gid": gid, "hide": hide}
    if not s.worker_user:  # the workspaces' uids (open_drive_dir refuses a folder of another one's)
        iso["uids"] = [int(s.worker_uid_base), int(s.worker_uid_base) + int(s.worker_uid_range)]
    return iso


# What a process-runtime worker's view shows of the host, read-only: its system folders (the software a worker runs
# with, as a container's image), never its data folders. Every other top-level folder (/home, /data, /mnt, /srv,
# /var, /boot, /run, a site's /scratch ...) is an empty folder in the view, so no granted host path and no drive
# folder of any workspace shows there: a worker sees its own drives at their mount paths only, and its Python
# environment (shim.exposed_paths) wherever it lies.
SHOWN = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt", "sys"})
# The worker's /dev, as a container's (oci_spec: the usual nodes) plus the GPUs' (their device cgroup lets a worker
# use its own only) and InfiniBand's: not /dev/fuse, /dev/net/tun, /dev/kvm, loop or disk devices. /dev/shm and
# /dev/mqueue are mounted for each worker (enter()).
DEV_NODES = frozenset({"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "fd", "stdin", "stdout",
                       "stderr", "core", "infiniband"})


def _dev_shown(name: str) -> bool:
    return name in DEV_NODES or name.startswith("nvidia")


def _worker_dev(dst: str) -> None:
    """The worker's /dev at `dst`: a tmpfs holding a bind of each of the host's /dev entries it may use (DEV_NODES,
    the GPUs'), and empty /dev/shm and /dev/mqueue."""
    os.mkdir(dst, 0o755)
    mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for e in os.scandir("/dev"):
        if _dev_shown(e.name):
            _bind_entry(e, os.path.join(dst, e.name))
    for d in ("shm", "mqueue"):
        os.mkdir(os.path.join(dst, d), 0o755)


def _show_resolver(root: str) -> None:
    """Where /etc/resolv.conf is a symlink out of the system folders (systemd-resolved's /run/systemd/resolve/...),
    its file read-only at its own path in the view, so names resolve as on the host."""
    try:
        real = os.path.realpath("/etc/resolv.conf")
        if not os.path.isfile(real) or _components(real)[0] in SHOWN:
            return
        dst = os.path.join(root, real.lstrip("/"))
        os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
        with open(dst, "w"):
            pass
        mount(real, dst, None, MS_BIND)
    except (OSError, IndexError):
        pass


def shown(path: str) -> bool:
    """Whether the host's `path` shows in a worker's view (under one of its system folders)."""
    parts = _components(os.path.normpath(path))
    return bool(parts) and parts[0] in SHOWN


def _bind_entry(e: os.DirEntry, dst: str) -> None:
    """Make `dst` show the directory entry `e`: the same symlink, or a bind mount of its folder (recursive) or
    file over a mount point made for it."""
    if e.is_symlink():
        os.symlink(os.readlink(e.path), dst)
    elif e.is_dir(follow_symlinks=False):
        os.mkdir(dst, 0o755)
        mount(e.path, dst, None, MS_BIND | MS_REC)
    else:
        with open(dst, "w"):
            pass
        mount(e.path, dst, None, MS_BIND)


def drop_privileges(uid: int, gid: int) -> None:
    """Become uid:gid for good: no supplementary groups, an empty bounding set, no capabilities, no_new_privs."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    os.setgroups([])
    for cap in range(last + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # from root to non-root: permitted, effective and ambient sets are cleared
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()
    if _libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if os.getuid() == 0 or os.geteuid() == 0:
        raise OSError(1, "still root after setresuid")


def enter_network(path: str | None) -> None:
    """This process (the worker's PID 1, as root) and what it starts join the worker's own network namespace, which
    the agent made (astraeus.agent.network); None: the machine's (`network: host`, or an agent without them)."""
    if not path:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(f"cannot enter the worker's network namespace {path}: {e.strerror}") from None
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise MountError(f"cannot enter the worker's network namespace {path}: {os.strerror(e)}")
    finally:
        os.close(fd)


def unshare_ipc_namespace() -> None:
    """This process (the worker's PID 1, as root, before its view) and what it starts get an IPC namespace of their
    own: no System V shared memory, semaphores or message queues, nor POSIX message queues, of anyone else's."""
    if _libc.unshare(CLONE_NEWIPC) != 0:
        e = ctypes.get_errno()
        raise MountError(f"cannot create an IPC namespace (unshare CLONE_NEWIPC): {os.strerror(e)}")


def unshare_pid_namespace() -> None:
    """The next child this process forks is PID 1 of a new PID namespace."""
    if _libc.unshare(CLONE_NEWPID) != 0:
        e = ctypes.get_errno()
        raise MountError(f"cannot create a PID namespace (unshare CLONE_NEWPID): {os.strerror(e)}")


def hand_over(fd: int, uid: int, gid: int, created: bool) -> None:
    """Give a ReadWrite drive's host folder to the workspace's user when it is root's and new or empty."""
    st = os.stat(fd)
    if st.st_uid != 0 or st.st_uid == uid:
        return
    if not created and os.listdir(f"/proc/self/fd/{fd}"):
        return
    os.chown(f"/proc/self/fd/{fd}", uid, gid)
    os.chmod(f"/proc/self/fd/{fd}", 0o700)


# ------------------------------------------------------------------------------------------- the worker's view
_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}


def _unescape(p: str) -> str:
    return p.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, int]]:
    """(mount point, nosuid/nodev/noexec flags) of every mount in this namespace, as /proc/self/mountinfo says."""
    out = []
    with open(mountinfo) as f:
        for line in f:
            parts = line.split()
            flags = 0
            for o in parts[5].split(","):
                flags |= _FLAGS.get(o, 0)
            out.append((_unescape(parts[4]), flags))
    return out


def _pivot_root(new_root: str, put_old: str) -> None:
    nr = SYS_PIVOT_ROOT.get(os.uname().machine)  # platform.machine(), without importing platform in each worker
    if nr is None or _libc.syscall(nr, _b(new_root), _b(put_old)) != 0:
        e = ctypes.get_errno() if nr is not None else 38
        raise OSError(e, f"pivot_root: {os.strerror(e)}")


def umount(path: str) -> None:
    if _libc.umount2(_b(path), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"umount {path}: {os.strerror(e)}")


OLD = "/.astraeus-host"


class WorkerView:
    """Builds a worker's view (see the module's docstring). Used in the worker's PID 1, as root, in this order:
    open() the sources while the host is still visible, enter(), mount drives/configs/the working folder,
    seal()."""

    def __init__(self, root_dir: str, hide: list[str], template: tuple[int, str] | None = None):
        self.root_dir = root_dir
        self.hide = [os.path.normpath(h) for h in hide]
        self.ours: set[int] = set()  # st_dev of the tmpfs made here (entries may be made in them)
        self.read_only_later: list[str] = []
        self.n = 0
        # Made from the prepared view (ViewTemplate): its root is shared with every worker's view made from it, and
        # read-only, so nothing is made in it (make() needing a new entry in / raises NeedFresh); the sources of
        # binds are open_tree() copies made in the host's namespace.
        self.template = template

    def tmpfs(self, path: str, mode: str, uid: int = 0, gid: int = 0, size: str | None = None) -> None:
        opts = f"mode={mode},uid={uid},gid={gid}" + (f",size={size}" if size else "")
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts)
        self.ours.add(os.stat(path).st_dev)

    def private(self) -> None:
        """Enter a private mount namespace (open the drives' and configs' sources next, then enter()). From a
        template: nothing yet (the sources are opened in the host's namespace and copied by source())."""
        if self.template is not None:
            return
        if _libc.unshare(CLONE_NEWNS) != 0:
            e = ctypes.get_errno()
            raise MountError(f"cannot create a mount namespace (unshare CLONE_NEWNS): {os.strerror(e)}; "
                             "the agent must run as root")
        mount(None, "/", None, MS_REC | MS_PRIVATE)

    def source(self, fd: int) -> int:
        """What bind() mounts for the O_PATH descriptor `fd` opened after private(): itself, or from a template
        its open_tree() copy (`fd` is closed)."""
        if self.template is None:
            return fd
        try:
            return open_tree(fd)
        finally:
            os.close(fd)

    def host_read_only(self, proc: bool) -> None:
        """In a new mount namespace: pivot into a new root, a tmpfs holding a read-only bind of each of the host's
        system folders (SHOWN) and top-level symlinks, an empty folder for each other top-level folder (the data
        folders: no granted host path or drive folder shows), the worker's /dev (_worker_dev), the resolver's
        file where /etc/resolv.conf leads out of the system folders; /proc, /tmp, /root: empty folders (with
        `proc`, a new proc on /proc). The host's tree stays at OLD."""
        r = self.root_dir
        os.makedirs(r, mode=0o700, exist_ok=True)
        self.tmpfs(r, "755")
        for e in os.scandir("/"):
            dst = os.path.join(r, e.name)
            if e.name in ("proc", "tmp", "root"):
                os.mkdir(dst, 0o755)
            elif e.name == "dev" and e.is_dir(follow_symlinks=False):
                _worker_dev(dst)
            elif e.is_symlink() or e.name in SHOWN:
                _bind_entry(e, dst)
            elif e.is_dir(follow_symlinks=False):
                os.mkdir(dst, 0o755)  # a data folder (/home, /data, /mnt, /srv, /var ...): empty in the view
        _show_resolver(r)
        os.mkdir(os.path.join(r, OLD.lstrip("/")), 0o700)
        _pivot_root(r, os.path.join(r, OLD.lstrip("/")))
        os.chdir("/")
        if proc:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for mp, flags in _mounts("/proc/self/mountinfo" if proc else OLD + "/proc/self/mountinfo"):  # everything of the host's is read-only here
            if mp in ("/", "/proc") or mp == OLD or mp.startswith(OLD + "/"):
                continue
            try:
                mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
            except OSError as e:
                raise MountError(f"cannot make the host's {mp} read-only in the worker's view: {e.strerror}") from None

    def enter(self) -> None:
        """Make the root the read-only host's system folders, with a new /proc, private /tmp, /dev/shm and
        /dev/mqueue (of the worker's IPC namespace), and the hidden paths.
        From a template: a copy of its namespace (the host read-only, made once), if the host is as it was then
        (else NeedFresh)."""
        if self.template is not None:
            fd, sig = self.template
            if host_signature() != sig:
                raise NeedFresh("the host's mounts or top-level entries changed since the view was prepared")
            setns(fd, CLONE_NEWNS)
            if _libc.unshare(CLONE_NEWNS) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"unshare CLONE_NEWNS: {os.strerror(e)}")
            os.chdir("/")
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        else:
            self.host_read_only(proc=True)
        self.tmpfs("/tmp", "1777")
        self.tmpfs("/root", "755")
        if os.path.isdir("/dev/shm"):
            self.tmpfs("/dev/shm", "1777")
        if os.path.isdir("/dev/mqueue"):  # the worker's own IPC namespace's (unshare_ipc_namespace, before)
            mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        self.hide_again()

    def hide_again(self) -> None:
        """An empty tmpfs over each hidden path that shows (again: a drive may hold the agent's state dir)."""
        for h in self.hide:
            if h not in ("/", "/tmp", "/root") and os.path.isdir(h) and os.stat(h).st_dev not in self.ours:
                self.tmpfs(h, "755")

    # ---------------------------------------------------------------- entries in the view
    def _explode(self, d: str) -> None:
        """Replace host folder `d` (in the view) by a tmpfs holding a bind of each of its entries."""
        if self.template is not None and os.path.normpath(d) == "/":
            raise NeedFresh("a new entry in the view's root")  # the template's root is shared: never written
        self.n += 1
        stage = f"{'/tmp' if self.template is not None else ''}/.astraeus-stage-{self.n}"
        os.mkdir(stage, 0o700)
        st = os.stat(d)
        mount(d, stage, None, MS_BIND | MS_REC)
        self.tmpfs(d, f"{stat.S_IMODE(st.st_mode):o}", st.st_uid, st.st_gid)
        for e in os.scandir(stage):
            _bind_entry(e, os.path.join(d, e.name))
        umount(stage)
        os.rmdir(stage)
        self.read_only_later.append(d)

    def reach(self, path: str, uid: int) -> None:
        """Let the worker (uid) reach `path`: a host folder on the way that it may not search (mode 0700 of
        another owner) is covered by an empty tmpfs (its contents were out of the worker's reach anyway)."""
        cur = "/"
        for part in _components(os.path.normpath(path))[:-1]:
            cur = os.path.join(cur, part)
            try:
                st = os.stat(cur)
            except OSError:
                return
            if not stat.S_ISDIR(st.st_mode) or st.st_dev in self.ours:
                continue
            if st.st_uid != uid and not st.st_mode & 0o001:
                self.tmpfs(cur, "755")
                return

    def _writable_here(self, d: str) -> bool:
        return os.stat(d).st_dev in self.ours

    def make(self, path: str, is_dir: bool, what: str = "mount path") -> str:
        """Make `path` exist in the view (never on the host) so something can be mounted on it."""
        if not os.path.isabs(path):
            raise MountError(f"{what} {path!r} is not absolute")
        path = os.path.normpath(path)
        if os.path.lexists(path):
            if is_dir and not os.path.isdir(path):
                raise MountError(f"{what} {path} exists and is not a folder")
            if not is_dir and os.path.isdir(path):
                raise MountError(f"config mount path {path} is a folder")
            return path
        cur = "/"
        parts = _components(path)
        for i, part in enumerate(parts):
            nxt = os.path.join(cur, part)
            last = i == len(parts) - 1
            if os.path.lexists(nxt):
                nxt = os.path.realpath(nxt)
                if not last and not os.path.isdir(nxt):
                    raise MountError(f"{what} {path}: {nxt} is not a folder")
                cur = nxt
                continue
            if not self._writable_here(cur):
                self._explode(cur)
            if last and not is_dir:
                with open(nxt, "w"):
                    pass
            else:
                os.mkdir(nxt, 0o755)
            cur = nxt
        return path

    def bind(self, fd: int, path: str, is_dir: bool, read_only: bool, what: str) -> None:
        target = self.make(path, is_dir, what)
        try:
            if self.template is not None:
                move_mount(fd, target)
            else:
                mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
            if read_only:
                mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except OSError as e:
            raise MountError(f"cannot mount {what} at {path}: {e.strerror}") from None

    def seal(self) -> None:
        """Let go of the host's tree and make the view's own folders read-only."""
        if self.template is None:
            umount(OLD)
            os.rmdir(OLD)
        for d in self.read_only_later:
            mount(None, d, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


class NeedFresh(Exception):
    """A worker's view cannot be made from the prepared one (the host changed, or it needs a new entry in /): it
    is built from scratch instead."""


def host_signature() -> str:
    """What a prepared view reflects of the host: its mounts (this namespace's mountinfo) and its top-level entries
    (names, kinds, symlink targets). Read in the host's mount namespace."""
    import hashlib

    h = hashlib.sha1()
    with open("/proc/self/mountinfo", "rb") as f:
        h.update(f.read())
    for e in sorted(os.scandir("/"), key=lambda e: e.name):
        link = os.readlink(e.path) if e.is_symlink() else ""
        h.update(f"\0{e.name}\0{e.is_dir(follow_symlinks=False)}\0{link}".encode())
    try:
        h.update("\0".join(sorted(n for n in os.listdir("/dev") if _dev_shown(n))).encode())  # GPUs that came
    except OSError:
        pass
    return h.hexdigest()


def drop_template() -> None:
    """Close this process's descriptor of the prepared view (the shim, once its worker's PID 1 has its own)."""
    global TEMPLATE
    if TEMPLATE is not None:
        try:
            os.close(TEMPLATE[0])
        except OSError:
            pass
        TEMPLATE = None


def prepare_template() -> tuple[int, str]:
    """Prepare the view's host part once (ViewTemplate): in a forked child, a new mount namespace whose root is
    the host read-only (host_read_only(), the host's tree let go of, / itself read-only; no /proc, /tmp, /root
    mounted: each worker's view mounts its own). Returns a descriptor of that namespace (it lives as long as a
    descriptor of it is open) and the host's signature it reflects. As root; raises OSError."""
    sig = host_signature()
    ok_r, ok_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(ok_r)
            os.close(go_w)
            view = WorkerView("/tmp", [], None)
            view.private()
            # the new root is a tmpfs over /tmp in this namespace only (nothing is made on the host)
            view.host_read_only(proc=False)
            umount(OLD)
            os.rmdir(OLD)
            mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            os.write(ok_w, b"k")
            os.read(go_r, 1)  # until the parent holds the namespace
            code = 0
        except BaseException as e:  # noqa: BLE001
            try:
                os.write(ok_w, f"E{e}".encode()[:1000])
            except OSError:
                pass
        finally:
            os._exit(code)
    os.close(ok_w)
    os.close(go_r)
    try:
        answer = os.read(ok_r, 1000)
        if answer != b"k":
            raise OSError(f"cannot prepare the workers' view: {answer[1:].decode(errors='replace') or 'no answer'}")
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ok_r)
        os.close(go_w)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by the kernel: the shim launcher ignores SIGCHLD
            pass
    return fd, sig
