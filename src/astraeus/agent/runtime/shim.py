"""Per-worker supervisor: `python -m astraeus.agent.runtime.shim <worker-dir>/spec.json` (why one per worker:
docs/design-worker-supervisor.md).

Why a shim (as in containerd/Nomad): if the agent were the worker's parent, a restarted agent could not learn
the exit code of a worker that ended while it was down, and a dead agent reading the worker's output pipes
would SIGPIPE it. The shim is not the agent's child and has its own session (forked by the agent's shim launcher,
astraeus.agent.runtime.launcher, or, started as its own interpreter, by a double fork), so it outlives agent
restarts and upgrades. It:

1. enters a private mount namespace and binds the drives and configs (failures are written to failed.json
   with a clear message, and the command never starts);
2. creates the worker's cgroup(s) with its limits (memory, CPU quota, pids, GPU device nodes:
   astraeus.agent.runtime.cgroups) and forks the command: the child makes its own session/process group, waits
   until the shim has moved it into the cgroup(s), points stdout/stderr at pipes, chdirs and execs it, so the
   worker's main process IS the command (SIGTERM reaches `python ...` itself); started.json gets its PID;
3. reads the pipes and appends every line to log.jsonl as {"seq", "time", "stream", "text"} (seq counts
   lines of the attempt from 1; the agent tails the file, so nothing is lost or repeated across agent
   restarts);
3b. with a signal plan (spec "signal", Slurm's --signal), sends it `after` seconds from the command's start to the
   main process and its descendants (batch_only: the main process alone), once, and lets the worker run on;
4. on a stop request (stop.json + SIGUSR1 from the agent, or SIGTERM to the shim) sends SIGTERM to the
   main process only; when the grace runs out, SIGKILLs the whole tree: the cgroup (v2 cgroup.kill; v1
   freeze, kill each process, thaw), the
   process group, its descendants (the shim is a child subreaper, so double-forked children that left the
   process group are still its descendants) and any process carrying the worker's ASTRAEUS_WORKER_ID;
5. when the main process exits on its own, kills what it left behind (container semantics), removes the
   cgroup(s), writes exit.json {exit_code, signal, killed, finished_at, message, oom, oom_limit_bytes} (oom: the
   main process was SIGKILLed by the kernel's OOM killer at its memory limit) and exits.

If the worker folder is deleted (state dir wiped), the shim writes its files again within half a second
so a restarted agent can adopt it. Stdlib only, and as little of it as it needs: the shim is forked from a
pre-started launcher (astraeus.agent.runtime.launcher), and every module it holds makes each fork dearer (psutil
alone, 3 MB of the launcher's memory, doubled what a fork and its exit cost the machine); what it asked psutil
is read from /proc here, as psutil reads it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import selectors
import signal
import sys
import time

from astraeus.agent.runtime import seccomp

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
CAP_SYS_ADMIN = 21
PARTIAL_FLUSH_SECONDS = 1.0
MAX_LINE = 64 * 1024
# libc, from the symbols this process has loaded already: ctypes.util.find_library("c") runs `ldconfig -p`, a
# process start that each shim paid twice.
LIBC = ctypes.CDLL(None, use_errno=True)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The seccomp filter of an isolated worker (both supervisors: the C one gets these bytes in its plan), built once in
# the launcher; None on a machine whose system call numbers seccomp.py does not know (the shim logs so).
SECCOMP_PROGRAM = seccomp.program()
_BOOT_TIME: list[float] = []


def stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses): [0] is field 3 (the
    state), [1] field 4 (the parent), [19] field 22 (the start in clock ticks since boot), [45:49] fields 48-51
    (the argument and environment blocks); None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def create_time(pid: int) -> float | None:
    """When process `pid` started, in seconds since the epoch, as psutil.Process(pid).create_time() computes it
    (its start in clock ticks since boot plus the boot time, /proc/stat's btime), which is what the agent compares
    it with; None when there is no such process."""
    fields = stat_fields(pid)
    if not fields:
        return None
    try:
        ticks = int(fields[19])
        if not _BOOT_TIME:
            with open("/proc/stat", "rb") as f:
                _BOOT_TIME.append(float(next(ln for ln in f if ln.startswith(b"btime")).split()[1]))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return ticks / CLOCK_TICKS + _BOOT_TIME[0]


def proc_state(pid: int) -> str | None:
    """Process `pid`'s state letter (R, S, Z ...), None when there is no such process."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def children_by_scan() -> dict[int, list[int]]:
    """Every process's children, from each one's parent: one read per process, for a kernel without
    /proc/PID/task/TID/children."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := stat_fields(name)) and len(fields) > 1 and fields[1].isdigit():
            kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


# The worker's PID 1, run in the shim's fork (reaper(): no interpreter start of its own, which cost CPU for each
# worker and delayed reaping a quick command): it waits until the shim has found the command, reaps every
# process of the namespace and writes the command's wait status and how many processes are left when it ends;
# when PID 1 exits, the kernel kills the rest.
REAPER = """
import os
ack, status, cmd = (int(a) for a in ARGS)
os.read(ack, 1)
while True:
    try:
        pid, st = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    except InterruptedError:
        continue
    if pid == cmd:
        left = sum(1 for n in os.listdir("/proc") if n.isdigit() and n != "1")
        try:
            os.write(status, f"{st} {left}\\n".encode())
        except OSError:
            pass
"""
REAPER_CODE = compile(REAPER, "<astraeus-reaper>", "exec")  # once, in the launcher: not in each worker's PID 1


NOTIFY = ("started.json", "exit.json", "failed.json")  # a worker started, ended or failed to start
# Written to disk (fsync) before the shim goes on: a worker's outcome. The others (shim.json, started.json: pids,
# which mean nothing after the machine restarts; spec.json rewritten) need no more than the page cache, which an
# agent's or shim's crash keeps: each fsync would wait for the disk on a worker's path.
DURABLE = ("exit.json", "failed.json")
# failed.json's message when a supervisor is started without what it needs (the C supervisor's words too).
INCOMPLETE_PLAN = "the worker's supervisor got an incomplete plan"


def write_json(path: str, obj: dict) -> None:
    """Write `obj` whole (a temporary file renamed into place), then wake the agent for NOTIFY's files. An outcome
    (DURABLE) is synced to disk after the agent is woken, so that the agent's read and report do not wait for the
    disk: a machine that crashes before the sync finds no outcome (the same as a crash before it was written)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    name = os.path.basename(path)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # env values: 0600
        json.dump(obj, f)
        f.flush()
        os.replace(tmp, path)
        if name in NOTIFY:
            notify_agent(os.path.dirname(os.path.dirname(os.path.dirname(path))))
        if name in DURABLE:
            os.fsync(f.fileno())


def notify_agent(state_dir: str) -> None:
    """Wake the agent at once (it reconciles and reports) instead of at its next status poll.

    The agent holds `state_dir/events.fifo` open; without an agent the open fails and nothing waits.
    """
    try:
        fd = os.open(os.path.join(state_dir, "events.fifo"), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, b"!")
    except OSError:
        pass
    finally:
        os.close(fd)


def read_log_base(path: str) -> int:
    """Where a log file starts in the worker's whole log (bytes): its header line's "base", or 0 without one."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
        head = json.loads(first) if first.startswith(b'{"base":') else None
        return int(head["base"]) if head else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def log(msg: str) -> None:
    try:
        sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} shim[{os.getpid()}] {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass


def clear_identity(title: str) -> None:
    """Show /proc/self/cmdline as `title` and /proc/self/environ empty: write over this process's argument and
    environment blocks in place (as setproctitle does; their addresses are fields 48-51 of /proc/self/stat)."""
    try:
        arg_start, arg_end, env_start, env_end = (int(x) for x in (stat_fields("self") or [])[45:49])
    except ValueError:  # no such fields
        return
    if env_end > env_start:
        ctypes.memset(env_start, 0, env_end - env_start)
    if arg_end > arg_start:
        data = title.encode()[: arg_end - arg_start - 1]
        ctypes.memmove(arg_start, data + b"\0" * (arg_end - arg_start - len(data)), arg_end - arg_start)


def reaper(ack: int, status: int, cmd: int) -> None:
    """Become the worker's PID 1 (REAPER), in this fork of the shim: a clean one, as an interpreter of its own was,
    holding nothing of the shim's open but its two pipes (not the shim's log, its pipes to the command, nor its
    files), showing no environment (the shim's names its worker folder and owner, which adoption looks for) and
    named astraeus-reaper. Never returns."""
    try:
        keep = sorted((ack, status))
        os.closerange(3, keep[0])
        os.closerange(keep[0] + 1, keep[1])
        os.closerange(keep[1] + 1, 65536)
        clear_identity("astraeus-reaper")
        exec(REAPER_CODE, {"__name__": "reaper", "ARGS": [ack, status, cmd]})
    finally:
        os._exit(0)


def prepare_host(spec: dict, d: str, iso: dict | None) -> str | None:
    """The host's part of a worker's start that both supervisors need (this shim and the one in C,
    astraeus.agent.runtime.native): the shim's files 0600, the working folder made (the worker's, 0700, when it
    is the attempt's own), the config files (0440, root:the worker's group). What went wrong, for failed.json, or
    None."""
    for name in ("spec.json", "log.jsonl", "shim.log"):
        try:
            os.chmod(os.path.join(d, name), 0o600)
        except OSError:
            pass
    cwd = spec.get("cwd") or "/"
    try:
        if cwd == d or cwd.startswith(d + os.sep):  # the attempt's own folder: made here
            os.makedirs(cwd, exist_ok=True)
            if iso:
                os.chown(cwd, iso["uid"], iso["gid"])
                os.chmod(cwd, 0o700)
    except OSError as e:
        return f"working folder {cwd}: {e.strerror or e}"
    cdir = os.path.join(d, "configs")
    for i, c in enumerate(spec.get("configs") or []):  # each config's file, 0440 root:the worker's group
        src = os.path.join(cdir, str(i))
        try:
            os.makedirs(cdir, mode=0o700, exist_ok=True)
            fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(c.get("value") or "")
            if iso:
                os.chown(src, 0, iso["gid"])
                os.chmod(src, 0o440)
        except OSError as e:
            return f"config at {c.get('mount_path')}: {e.strerror or e}"
    return None


def signal_dir(d: str, iso: dict | None) -> str:
    """The folder of the worker's stop reason file: root's, searchable by the worker's group only."""
    sd = os.path.join(d, "signal")
    os.makedirs(sd, exist_ok=True)
    if iso:
        os.chown(sd, 0, int(iso["gid"]))
        os.chmod(sd, 0o750)
    return sd


def exposed_paths(spec: dict, iso: dict) -> list[str]:
    """The worker's Python environment and the interpreter it is built on, and Astraeus' srun and scontrol (spec
    "tools": astraeus.agent.slurm), shown read-only in its view even where they lie under a hidden folder
    (/root/.pyenv, a temporary folder); never anything of the agent's state or home (a path that is, holds or
    lies in a hidden one)."""
    hidden = [os.path.realpath(h) for h in iso.get("hide") or []]
    out = []
    for p in dict.fromkeys(os.path.realpath(x) for x in (spec.get("environment"), sys.prefix, sys.base_prefix,
                                                         spec.get("tools")) if x and os.path.isabs(x)):
        if os.path.isdir(p) and p != "/" and not any(p == h or p.startswith(h + "/") or h.startswith(p + "/")
                                                     for h in hidden):
            out.append(p)
    return out


def worker_home(env: dict[str, str], cwd: str, iso: dict) -> None:
    """An isolated worker's HOME is its working folder (its own, writable) where the one it was given is root's,
    hidden in its view, or in none of the host's folders its view shows (mounts.shown: /home is empty there)."""
    from astraeus.agent.runtime import mounts

    h = env.get("HOME") or "/root"
    if (h == "/root" or h.startswith("/root/") or any(h == x or h.startswith(x + "/") for x in iso["hide"])
            or not mounts.shown(h)):
        env["HOME"] = cwd


COMMAND_SIGDEF = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD,
                  signal.SIGHUP)


def spawn_command(argv: list[str], env: dict[str, str], out_w: int, err_w: int) -> int:
    """In the worker's PID 1 (already the workspace's user, in the working folder): start the command with
    posix_spawn (a vfork and exec: no copy of this Python process's memory map, which a fork of the shim cost each
    worker) in its own session, stdin /dev/null, stdout and stderr the shim's pipes, default signal handling and
    an empty signal mask; its pid. Found in the worker's PATH as os.execvpe finds it (a name with a slash as it
    is; else the first folder of PATH where it is an executable file, for this user). One spawn only: a spawn
    whose exec fails still takes a pid of the namespace, and the command must be its PID 2. An OSError (ENOENT,
    EACCES, ENOEXEC ...) when it cannot start."""
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
               (os.POSIX_SPAWN_DUP2, err_w, 2), (os.POSIX_SPAWN_CLOSE, out_w), (os.POSIX_SPAWN_CLOSE, err_w)]
    name = argv[0]
    path = name
    if not os.path.dirname(name):
        found = denied = None
        for d in os.get_exec_path(env):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                if os.access(p, os.X_OK):
                    found = p
                    break
                denied = denied or p
        if found is None:
            e = errno.EACCES if denied else errno.ENOENT
            raise OSError(e, os.strerror(e), name)
        path = found
    return os.posix_spawn(path, argv, env, file_actions=actions, setsid=True, setsigmask=(),
                          setsigdef=COMMAND_SIGDEF)


class Shim:
    def __init__(self, spec_path: str):
        self.spec_path = os.path.abspath(spec_path)
        self.dir = os.path.dirname(self.spec_path)
        with open(self.spec_path) as f:
            self.spec: dict = json.load(f)
        self.marker: str = self.spec.get("marker") or ""  # none: an incomplete plan, a start failure (run)
        self.cg = None  # the worker's cgroup(s): astraeus.agent.runtime.cgroups.WorkerCgroup, made by setup_cgroup
        self.pid: int | None = None  # the command (the worker's main process), as the host sees it
        self.init_pid: int | None = None  # our child: the worker's PID 1 (the command itself when not isolated)
        self.status_r: int | None = None
        self.iso: dict | None = None  # uid, gid, hidden paths (spec "isolation"); None: an agent that is not root
        self.pid_ctime: float | None = None
        self.status: int | None = None  # raw wait status of the main process
        self.stop_requested = False
        self.deadline: float | None = None
        # spec "signal" ({signo, name, after, batch_only}): sent `after` seconds from the command's start (the time
        # limit less Slurm's --signal SECS), once
        self.signal_plan: dict | None = self.spec.get("signal")
        self.signal_at: float | None = None
        self.killed = False
        self.leftovers_killed = False
        self.seq = 0
        self.log_f = None
        # The log is kept in two files of at most half this size each (see rotate_log).
        self.log_half = max(32 * 1024, int(self.spec.get("log_file_bytes") or 64 * 1024**2) // 2)
        self.started: dict | None = None
        self.partial: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.partial_since: dict[str, float] = {}
        self.create_time = create_time(os.getpid())

    # ---------------------------------------------------------------- files
    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def write_shim_json(self) -> None:
        write_json(self.path("shim.json"), {"shim_pid": os.getpid(), "shim_create_time": self.create_time})

    def open_log(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        old = self.log_f
        self.log_f = open(self.path("log.jsonl"), "a", buffering=1, opener=lambda p, fl: os.open(p, fl, 0o600))
        if old is not None:
            try:
                if os.fstat(old.fileno()).st_nlink == 0 and os.fstat(self.log_f.fileno()).st_size == 0:
                    # the folder was wiped: carry the deleted file's lines over (lines the agent had not shipped
                    # yet would be lost otherwise; the server keeps one copy per seq of those it had)
                    with open(f"/proc/self/fd/{old.fileno()}", "rb") as f:
                        self.log_f.write(f.read().decode("utf-8", errors="replace"))
                old.close()
            except OSError as e:
                log(f"cannot carry the old log over: {e}")

    def rotate_log(self) -> None:
        """log.jsonl is full: it becomes log.jsonl.1 (the older .1 is dropped) and a new log.jsonl starts with a
        header line {"base": N}, N being the log's byte offset where the new file starts (its older files' bytes
        before it), so the agent's offsets keep counting across files.

        The new file is written with its header under another name and renamed into place: a reader never finds a
        log.jsonl without its header (it took an empty one for a replaced file and read the whole log again)."""
        base = read_log_base(self.path("log.jsonl")) + self.log_f.tell()
        self.log_f.close()
        fresh = self.path("log.jsonl.new")
        self.log_f = open(fresh, "w", buffering=1, opener=lambda p, fl: os.open(p, fl, 0o600))
        self.log_f.write(json.dumps({"base": base}) + "\n")
        os.replace(self.path("log.jsonl"), self.path("log.jsonl.1"))
        os.replace(fresh, self.path("log.jsonl"))

    def ensure_files(self) -> None:
        """Rewrite our files if the worker folder was wiped (a restarted agent adopts us from them)."""
        try:
            if os.path.exists(self.spec_path) and os.fstat(self.log_f.fileno()).st_nlink > 0:
                return
            log("worker folder or log file vanished; writing them again")
            os.makedirs(self.dir, exist_ok=True)
            write_json(self.spec_path, self.spec)
            self.write_shim_json()
            if self.started:
                write_json(self.path("started.json"), self.started)
            if not os.path.exists(self.path("log.jsonl")) or os.fstat(self.log_f.fileno()).st_nlink == 0:
                self.open_log()
        except OSError as e:
            log(f"cannot rewrite files: {e}")

    def emit(self, stream: str, data: bytes, now: float) -> None:
        text = data.decode("utf-8", errors="replace").rstrip("\r")
        self.seq += 1
        line = json.dumps({"seq": self.seq, "time": round(now, 6), "stream": stream, "text": text})
        try:
            if self.log_f.tell() + len(line) + 1 > self.log_half and self.log_f.tell() > 0:
                self.rotate_log()
            self.log_f.write(line + "\n")
        except OSError as e:
            log(f"cannot write log: {e}")

    def feed(self, stream: str, chunk: bytes, now: float) -> None:
        buf = self.partial[stream]
        if not buf:
            self.partial_since[stream] = now
        buf += chunk
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            self.emit(stream, bytes(buf[:i]), now)
            del buf[: i + 1]
            self.partial_since[stream] = now
        while len(buf) >= MAX_LINE:
            self.emit(stream, bytes(buf[:MAX_LINE]), now)
            del buf[:MAX_LINE]

    def flush_partials(self, now: float, force: bool) -> None:
        for stream, buf in self.partial.items():
            if buf and (force or now - self.partial_since.get(stream, now) >= PARTIAL_FLUSH_SECONDS):
                self.emit(stream, bytes(buf), now)
                buf.clear()

    # ---------------------------------------------------------------- setup
    def fail(self, message: str) -> None:
        log(f"start failed: {message}")
        # the cgroup(s) made for the worker before its start failed (an image that could not be pulled, ...): no
        # process of it is left in them, and nothing else would remove them
        self.cleanup_cgroup()
        write_json(self.path("failed.json"), {"message": message, "time": time.time()})
        sys.exit(0)

    def setup_mounts(self) -> None:
        """Host-side preparation of the worker's view (built later by its PID 1: build_view): the config files
        (0440, root:the worker's group), the working folder (the worker's), our own files 0600."""
        self.iso = self.spec.get("isolation") if os.geteuid() == 0 else None
        if not self.iso and (self.spec.get("mounts") or self.spec.get("configs")):
            self.fail("drives and configs need the agent to run as root (it builds each worker's own view)")
        problem = prepare_host(self.spec, self.dir, self.iso)
        if problem:
            self.fail(problem)

    def build_view(self, cwd: str) -> None:
        """In the worker's PID 1 (root, before the command forks): its own view of the machine
        (astraeus.agent.runtime.mounts.WorkerView): drives, configs and the working folder inside it. Made from
        the view the launcher prepared (mounts.TEMPLATE: the host read-only, made once, which spares each worker
        the pivot into a new root and the read-only remount of every host mount, serialised in the kernel across
        concurrent starts), or, without one or when it does not fit (the host changed since, a new entry in /),
        from scratch."""
        from astraeus.agent.runtime import mounts

        template, mounts.TEMPLATE = mounts.TEMPLATE, None
        if template is not None:
            host = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._build_view(cwd, template)
                return
            except Exception as e:  # noqa: BLE001
                # back in the host's namespace, from scratch (a drive's own error is then raised again there)
                mounts.setns(host, mounts.CLONE_NEWNS)
                os.chdir("/")
                if not isinstance(e, mounts.NeedFresh | mounts.MountError):
                    log(f"the prepared view did not work ({e}); building the worker's view from scratch")
            finally:
                os.close(host)
                os.close(template[0])
        self._build_view(cwd, None)

    def _build_view(self, cwd: str, template: tuple[int, str] | None) -> None:
        from astraeus.agent.runtime import mounts

        iso = self.iso
        view = mounts.WorkerView(self.path("root"), iso.get("hide") or [], template)
        view.private()
        drives = []
        for m in self.spec.get("mounts") or []:
            what = f"drive at {m.get('mount_path')}"
            try:
                fd = mounts.open_drive_dir(m["host_path"], m.get("granted_root"), bool(m.get("create")), iso)
                if not m.get("read_only"):
                    mounts.hand_over(fd, iso["uid"], iso["gid"], bool(m.get("create")))
            except mounts.MountError as e:
                raise mounts.MountError(f"{what}: {e}") from None
            except OSError as e:
                raise mounts.MountError(f"{what}: {e.strerror or e}") from None
            drives.append((view.source(fd), m["mount_path"], bool(m.get("read_only")), what))
        configs = []
        for i, c in enumerate(self.spec.get("configs") or []):
            configs.append((view.source(os.open(os.path.join(self.path("configs"), str(i)), os.O_PATH | os.O_CLOEXEC)),
                            c["mount_path"], f"config at {c.get('mount_path')}"))
        work = view.source(os.open(cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) if os.path.isdir(cwd) else None
        sig_dir = self.signal_dir()
        sig = view.source(os.open(sig_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        # the worker's Python environment and the interpreter it is built on, read-only, even where they lie
        # under a hidden folder (/root/.pyenv, a temporary folder); never anything of the agent's state or home
        expose = [(view.source(os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)), p)
                  for p in exposed_paths(self.spec, iso)]
        try:
            view.enter()
        except OSError as e:
            raise mounts.MountError(f"cannot build the worker's view: {e.strerror or e}") from None
        for fd, path, ro, what in drives:
            try:
                view.bind(fd, path, True, ro, what)
            except mounts.MountError as e:
                raise mounts.MountError(f"{what}: {e}") from None
            except OSError as e:
                raise mounts.MountError(f"{what}: {e.strerror or e}") from None
        view.hide_again()
        for fd, path, what in configs:
            try:
                view.bind(fd, path, False, True, what)
            except mounts.MountError as e:
                raise mounts.MountError(f"{what}: {e}") from None
            except OSError as e:
                raise mounts.MountError(f"{what}: {e.strerror or e}") from None
        for fd, p in expose:
            try:
                view.bind(fd, p, True, True, "the worker's environment")
            except (mounts.MountError, OSError) as e:
                raise mounts.MountError(f"the worker's environment {p}: {e}") from None
        try:
            view.reach(cwd, int(iso["uid"]))
            if work is not None:
                view.bind(work, cwd, True, False, "working folder")
            else:
                view.make(cwd, True, "working folder")
            view.bind(sig, sig_dir, True, True, "stop reason folder")
            view.seal()
        except OSError as e:
            raise mounts.MountError(f"cannot build the worker's view: {e.strerror or e}") from None

    def signal_dir(self) -> str:
        return signal_dir(self.dir, self.iso)

    def setup_cgroup(self) -> None:
        """Create the worker's cgroup(s) and write its limits (memory, CPU quota, pids, GPU nodes)."""
        from astraeus.agent.runtime import cgroups

        limits = cgroups.Limits.from_json(self.spec.get("limits"))
        self.cg = cgroups.WorkerCgroup.from_json(self.spec.get("cgroups") or self.spec.get("cgroup"))
        if self.cg is None:
            if limits.memory_bytes or limits.cpu_cores or limits.pids_max or limits.deny_devices:
                log("no cgroup on this machine: the worker's limits are not enforced")
            return
        try:
            warnings = self.cg.create(limits)
        except OSError as e:
            log(f"no cgroup ({self.cg.name}): {e}; the worker's limits are not enforced")
            self.cg = None
            return
        for w in warnings:
            log(w)

    def start(self) -> None:
        spec = self.spec
        if not spec.get("command"):
            self.fail(f"{INCOMPLETE_PLAN}: spec.json has no command")
        cwd = spec.get("cwd") or "/"
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        go_r, go_w = os.pipe()
        res_r, res_w = os.pipe2(os.O_CLOEXEC)
        self.status_r, status_w = os.pipe2(os.O_CLOEXEC)  # the worker's PID 1 writes the command's wait status
        ack_r, ack_w = os.pipe2(os.O_CLOEXEC)  # we found the command's pid: PID 1 may reap it
        argv = [spec["command"], *[str(a) for a in spec.get("args") or []]]
        env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        libc = LIBC
        iso = self.iso
        if iso:
            worker_home(env, cwd, iso)
            if SECCOMP_PROGRAM is None:
                log(f"no seccomp filter: this machine's system calls ({os.uname().machine}) are not known here")
            from astraeus.agent.runtime import mounts

            try:
                mounts.unshare_pid_namespace()  # the next child is PID 1 of the worker's own PID namespace
            except mounts.MountError as e:
                self.fail(str(e))
        pid = os.fork()
        if pid == 0:  # the worker's PID 1 (or, not isolated, the command itself)
            try:
                for fd in (out_r, err_r, go_w, res_r, self.status_r, ack_w):
                    os.close(fd)
                signal.set_wakeup_fd(-1)
                for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                          signal.SIGCHLD, signal.SIGHUP):
                    signal.signal(s, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                if not os.read(go_r, 1):  # wait until the shim has put us in the cgroup
                    os._exit(0)  # the shim is gone
                os.close(go_r)
                if iso:
                    from astraeus.agent.runtime import mounts

                    try:
                        mounts.enter_network(iso.get("netns"))  # its own network (astraeus.agent.network)
                        mounts.unshare_ipc_namespace()  # before the view: its /dev/mqueue is this namespace's
                        self.build_view(cwd)
                    except (mounts.MountError, OSError) as e:
                        os.write(res_w, b"FAIL:" + str(e).encode()[:4000])
                        os._exit(126)
                    # PID 1 needs root no more: it becomes the workspace's user (no capabilities at all,
                    # no_new_privs, not dumpable: the worker can neither ptrace it nor open its descriptors), takes
                    # the containers' seccomp filter (astraeus.agent.runtime.seccomp) and spawns the command, which
                    # inherits all that, in the working folder
                    mounts.drop_privileges(int(iso["uid"]), int(iso["gid"]))
                    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
                    if SECCOMP_PROGRAM is not None:
                        try:
                            seccomp.install(SECCOMP_PROGRAM)
                        except OSError as e:
                            os.write(res_w, b"FAIL:" + str(e.strerror).encode()[:4000])
                            os._exit(126)
                    os.chdir(cwd)
                    cmd = spawn_command(argv, env, out_w, err_w)
                    # PID 1: reports the command's wait status and how many processes it left, and reaps the rest
                    reaper(ack_r, status_w, cmd)
                # not isolated (an agent that is not root): this child is the command
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for fd in (null, out_w, err_w):
                    if fd > 2:
                        os.close(fd)
                # no CAP_SYS_ADMIN after exec either
                libc.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0)
                os.chdir(cwd)
                os.execvpe(argv[0], argv, env)
            except BaseException as e:  # noqa: BLE001
                msg = f"{argv[0]}: {e.strerror}" if isinstance(e, OSError) and e.strerror else f"{argv[0]}: {e!r}"
                try:
                    os.write(res_w, msg.encode()[:4000])
                finally:
                    os._exit(127)
        from astraeus.agent.runtime import mounts

        mounts.drop_template()  # the worker's PID 1 has its own
        os.close(status_w)
        os.close(ack_r)
        os.set_blocking(self.status_r, False)
        self.init_pid = pid
        os.close(out_w)
        os.close(err_w)
        os.close(go_r)
        os.close(res_w)
        if self.cg:  # joined here, by root, while the child waits: before it drops privileges and execs
            for w in self.cg.add(pid):
                log(f"{w}; tracking the worker without it")
            if not self.cg.dirs:
                self.cg = None
        os.write(go_w, b"x")
        os.close(go_w)
        err = b""
        while True:
            chunk = os.read(res_r, 4096)
            if not chunk:
                break
            err += chunk
        os.close(res_r)
        if err:
            os.close(ack_w)  # PID 1 (waiting for it) reaps the failed command and exits
            os.waitpid(pid, 0)
            self.cleanup_cgroup()
            if err.startswith(b"FAIL:"):  # the worker's view could not be built (a drive or config)
                self.fail(err[5:].decode(errors="replace"))
            self.fail(f"cannot start the command: {err.decode(errors='replace')}")
        if iso:
            pid = self.find_command(pid)
            os.write(ack_w, b"x")
        os.close(ack_w)
        self.record_started(pid, out_r, err_r)

    def record_started(self, pid: int, out_r: int, err_r: int, **extra) -> None:
        """The command runs as `pid` (the host's view), its output on these pipes: started.json says so."""
        self.pid = pid
        self.pid_ctime = create_time(pid)
        self.started = {"pid": pid, "pid_create_time": self.pid_ctime, "pgid": pid, "shim_pid": os.getpid(),
                        "shim_create_time": self.create_time, "started_at": time.time(),
                        "cgroup": self.cg.primary if self.cg else None,
                        "cgroups": self.cg.to_json() if self.cg else None, "limits": self.spec.get("limits"),
                        **extra}
        write_json(self.path("started.json"), self.started)
        self.out_r, self.err_r = out_r, err_r

    def find_command(self, init_pid: int) -> int:
        """The command's pid as the host sees it: the child of the worker's PID 1 that is PID 2 inside."""
        for _ in range(200):
            kids = self._children(init_pid)
            for k in kids:
                try:
                    with open(f"/proc/{k}/status") as f:
                        ns = next((ln.split()[1:] for ln in f if ln.startswith("NSpid:")), [])
                except OSError:
                    continue
                if ns and ns[-1] == "2":
                    return k
            time.sleep(0.005)
        self.sig(init_pid, signal.SIGKILL)
        self.fail("cannot find the worker's main process in its PID namespace")
        raise AssertionError  # not reached

    @staticmethod
    def _children(pid: int) -> list[int]:
        """pid's children: from /proc/PID/task/PID/children where the kernel has it (one read), else from every
        process's parent (children_by_scan)."""
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return [int(x) for x in f.read().split()]
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}"):
                return children_by_scan().get(pid, [])
            return []
        except (OSError, ValueError):
            return []

    def read_status(self) -> None:
        """What the worker's PID 1 wrote when the command ended: its wait status and how many it left."""
        if self.status_r is None:
            return
        try:
            data = os.read(self.status_r, 256)
        except BlockingIOError:
            return
        if not data:
            os.close(self.status_r)
            self.status_r = None
            return
        st, _, left = data.decode().partition(" ")
        if self.status is None:
            self.status = int(st)
            self.finished_at = time.time()
        if left.strip() == "0":  # nothing left: PID 1 exits at once
            for _ in range(200):
                try:
                    if os.waitpid(self.init_pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.005)

    # ---------------------------------------------------------------- tree
    def cgroup_pids(self) -> list[int]:
        return sorted(self.cg.pids()) if self.cg else []

    def descendants(self, root: int | None = None) -> list[int]:
        """The live (not zombie) descendants of `root` (ours by default): walked through /proc/PID/task/TID/children
        where the kernel has it (a few reads), else from every process's parent (children_by_scan)."""
        me = os.getpid() if root is None else root
        if os.path.exists(f"/proc/{me}/task/{me}/children"):
            out, todo, seen = [], [me], {me}
            while todo:
                pid = todo.pop()
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for tid in tids:
                    try:
                        with open(f"/proc/{pid}/task/{tid}/children") as f:
                            kids = [int(x) for x in f.read().split()]
                    except (OSError, ValueError):
                        continue
                    for k in kids:
                        if k in seen:
                            continue
                        seen.add(k)
                        todo.append(k)
                        if proc_state(k) not in (None, "Z"):
                            out.append(k)
            return out
        kids = children_by_scan()
        out, todo = [], [me]
        while todo:
            for k in kids.get(todo.pop(), []):
                todo.append(k)
                if proc_state(k) not in (None, "Z"):
                    out.append(k)
        return out

    def marked(self) -> list[int]:
        want = f"ASTRAEUS_WORKER_ID={self.marker}".encode()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if want in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                continue
        return found

    def tree_alive(self) -> bool:
        if self.status is None:
            return True
        return bool(self.cgroup_pids() or self.descendants())

    def kill_tree(self) -> None:
        for attempt in range(20):
            if self.cg:
                self.cg.kill()
            if self.pid is not None:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except OSError:
                    pass
            pids = set(self.descendants()) | set(self.cgroup_pids())
            if attempt == 0:
                pids |= set(self.marked())
            for p in pids:
                self.sig(p, signal.SIGKILL)
            self.reap()
            time.sleep(0.02)
            self.reap()
            if not (self.cgroup_pids() or self.descendants()) and self.status is not None:
                return

    @staticmethod
    def sig(pid: int, s: int) -> None:
        try:
            os.kill(pid, s)
        except OSError:
            pass

    def reap(self) -> None:
        if self.status is None and self.status_r is not None:
            self.read_status()
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.init_pid:
                self.read_status()  # PID 1 has ended: what it wrote is all there
                if self.status is None:
                    self.status = status
                    self.finished_at = time.time()

    def cleanup_cgroup(self) -> None:
        if self.cg and not self.cg.remove(timeout=1.0):
            log(f"cannot remove the cgroup {self.cg.name}: processes are left in {self.cg.dirs}")

    # ---------------------------------------------------------------- stop
    def check_stop(self, now: float) -> None:
        if self.stop_requested:
            return
        req = read_json(self.path("stop.json"))
        if req is None and not self.sigterm:
            return
        if req is None:
            req = {"grace": float(self.spec.get("stop_grace", 30)), "requested_at": now}
        self.stop_requested = True
        self.deadline = float(req.get("requested_at", now)) + float(req.get("grace", 30))
        log(f"stop requested, grace until {self.deadline:.3f} (in {self.deadline - now:.1f}s)")
        if self.status is None and self.pid is not None:
            self.write_stop_reason(req.get("reason") or ("the worker's supervisor was asked to stop it"
                                                         if self.sigterm else "stopped"),
                                   max(0.0, self.deadline - now), float(req.get("requested_at", now)))
            self.sig(self.pid, signal.SIGTERM)

    def check_signal(self, now: float) -> None:
        """The plan's signal, once its time has come, to a worker still running and not being stopped."""
        if self.signal_at is None or now < self.signal_at or self.status is not None or self.pid is None:
            return
        self.signal_at = None
        if self.stop_requested:
            return
        plan = self.signal_plan or {}
        signo = int(plan.get("signo") or signal.SIGUSR1)
        whole = not plan.get("batch_only")
        # the worker's own tree: not the shim's other children (its output readers would die of the signal)
        targets = [self.pid] + ([p for p in self.descendants(self.pid) if p != self.init_pid] if whole else [])
        log(f"sending SIG{plan.get('name') or signo} to {'the worker' if whole else 'its main process'} "
            f"(pids {' '.join(map(str, targets))}) before its time limit")
        for p in targets:
            self.sig(p, signo)

    def write_stop_reason(self, reason: str, grace: float, requested_at: float) -> None:
        """Before SIGTERM: why the worker is stopped and the grace it has, in the file its
        ASTRAEUS_STOP_REASON_FILE names (signal/stop-reason: root's, readable by the worker's group only), so a
        script can choose a quick save over a full one."""
        d = self.path("signal")
        try:
            os.makedirs(d, exist_ok=True)
            tmp = os.path.join(d, ".stop-reason.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"reason": reason, "grace_seconds": round(grace, 3), "requested_at": requested_at}, f)
                f.write("\n")
            if self.iso:
                os.chown(tmp, 0, int(self.iso["gid"]))
                os.chmod(tmp, 0o440)
            else:
                os.chmod(tmp, 0o444)
            os.replace(tmp, os.path.join(d, "stop-reason"))
        except OSError as e:
            log(f"cannot write the stop reason: {e}")

    # ---------------------------------------------------------------- main loop
    def run(self) -> None:
        self.sigterm = False
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

        def on_term(signum, _frame):
            self.sigterm = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, lambda s, f: None)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        try:
            LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except Exception as e:  # noqa: BLE001
            log(f"no child subreaper: {e}")
        if not self.marker:  # as the C supervisor: the agent hears it at once, not at its start timeout
            self.fail(f"{INCOMPLETE_PLAN}: spec.json has no marker")
        self.write_shim_json()
        self.open_log()
        self.setup_mounts()
        self.setup_cgroup()
        self.start()
        log(f"started pid {self.pid}: {self.spec['command']} {self.spec.get('args')}")
        if self.signal_plan:
            self.signal_at = time.time() + float(self.signal_plan.get("after") or 0)

        sel = selectors.DefaultSelector()
        open_streams = {self.out_r: "stdout", self.err_r: "stderr"}
        for fd in open_streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        last_files_check = 0.0
        drain_until: float | None = None
        while True:
            now = time.time()
            timeout = 0.25
            if self.deadline is not None and self.status is None:
                timeout = max(0.0, min(timeout, self.deadline - now))
            if self.signal_at is not None:
                timeout = max(0.0, min(timeout, self.signal_at - now))
            for key, _ in sel.select(timeout):
                fd = key.fd
                if fd == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    self.feed(open_streams[fd], chunk, time.time())
                else:
                    sel.unregister(fd)
                    os.close(fd)
                    self.flush_partials(time.time(), force=True)
                    del open_streams[fd]
            now = time.time()
            self.reap()
            self.check_stop(now)
            self.check_signal(now)
            self.flush_partials(now, force=False)
            if now - last_files_check >= 0.5:
                last_files_check = now
                self.ensure_files()
            if drain_until is not None:
                if not open_streams or now >= drain_until:
                    break
                continue
            if self.status is None:
                if self.deadline is not None and now >= self.deadline:
                    log("stop grace ran out: SIGKILL to the whole tree")
                    self.killed = True
                    self.kill_tree()
                continue
            # the main process has ended
            if self.tree_alive():
                if not self.stop_requested or (self.deadline is not None and now >= self.deadline):
                    if self.stop_requested:
                        log("stop grace ran out: SIGKILL to what the main process left behind")
                        self.killed = True
                    else:
                        log("main process ended; killing what it left behind")
                    self.leftovers_killed = True
                    self.kill_tree()
                else:
                    continue
            drain_until = now + 1.0
            if not open_streams:
                break
        self.flush_partials(time.time(), force=True)
        self.finish()

    def finish(self) -> None:
        st = self.status
        exit_code = sig = None
        if st is not None:
            if os.WIFSIGNALED(st):
                sig = os.WTERMSIG(st)
            else:
                exit_code = os.WEXITSTATUS(st)
        msg = None
        # SIGKILLed, not by us, with an OOM kill recorded in its memory cgroup: it went over its memory limit
        limit = (self.spec.get("limits") or {}).get("memory_bytes") or None
        oom = bool(sig == signal.SIGKILL and not self.killed and self.cg and self.cg.oom_kills())
        if oom:
            from astraeus.units import human_bytes

            msg = f"killed by the kernel: out of memory (limit {human_bytes(limit)})" if limit else \
                "killed by the kernel: out of memory"
        elif self.killed:
            msg = "killed (SIGKILL) when the stop grace ran out"
        elif self.leftovers_killed:
            msg = "processes left behind by the main process were killed"
        self.cleanup_cgroup()
        write_json(self.path("exit.json"), {"exit_code": exit_code, "signal": sig, "killed": self.killed,
                                             "finished_at": getattr(self, "finished_at", time.time()),
                                             "stop_requested": self.stop_requested, "message": msg,
                                             "oom": oom, "oom_limit_bytes": limit if oom else None})
        log(f"worker exited: exit_code={exit_code} signal={sig} killed={self.killed}")


def main(argv: list[str], detached: bool = False, supervisor: type[Shim] | None = None) -> None:
    """`detached`: this process was forked by the shim launcher, in its own session, and is not the agent's child:
    no double fork. `supervisor`: the class that supervises the worker (Shim; a container worker's shim is
    `python -m astraeus.agent.runtime.container_shim`, whose main gives its ContainerShim)."""
    if len(argv) != 2:
        print("usage: python -m astraeus.agent.runtime.shim <spec.json>", file=sys.stderr)
        sys.exit(2)
    if not detached:
        if os.fork():  # detach: the agent reaps the first child at once; the shim is reparented away from it
            os._exit(0)
        os.setsid()
    try:
        (supervisor or Shim)(argv[1]).run()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001
        import traceback  # here only: every module the launcher holds makes each fork dearer

        log("shim crashed:\n" + traceback.format_exc())
        d = os.path.dirname(os.path.abspath(argv[1]))
        if not os.path.exists(os.path.join(d, "started.json")):
            try:
                write_json(os.path.join(d, "failed.json"), {"message": "the worker's supervisor crashed: "
                                                            + traceback.format_exc(limit=1).strip().splitlines()[-1],
                                                            "time": time.time()})
            except OSError:
                pass
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
