"""The per-worker shim for a container worker (spec.json has "container"): the same supervisor as the process
runtime's (astraeus.agent.runtime.shim.Shim: logs, stop grace, SIGKILL of the whole tree, exit status, adoption
after agent restarts, rewriting its files after a wipe), with the worker started by `runc` from its image.

How the worker starts (all by the shim, as root):
1. the image is pulled into the machine's cache (astraeus.agent.runtime.oci_images; one pull per digest even when
   several workers start at once); while it pulls, phase.json says `Pulling image …` (the worker's reason);
2. the shim enters a mount namespace of its own and mounts the container's root filesystem there: an overlay of
   the image (read-only, shared) and a fresh upper layer for this attempt (discarded when it ends); drives are
   opened without following symlinks out of their granted folder, as in the process runtime, and bound to a
   staging folder that only this namespace sees, which runc binds at the mount paths;
3. a small reaper is made PID 1 of a new PID namespace (it exits, killing everything in the namespace, when the
   shim is gone: it holds a pipe from the shim);
4. `runc run --detach` starts the command in that PID namespace (PID 2, so SIGTERM reaches it like any process),
   in the worker's cgroup (the one the shim made, with its limits; runc adds the device rules), as the
   workspace's unprivileged uid, with the container's stdout/stderr on the shim's pipes. runc exits at once and
   the command becomes the shim's child (the shim is a child subreaper): the shim reaps it and so knows its exact
   exit code or signal;
5. when it ends: what is left is killed, `runc delete` removes runc's record, the upper layer is removed and the
   image is released (the cache may evict images no worker uses).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

from astraeus.agent.runtime import cgroups, mounts, oci_spec
from astraeus.agent.runtime.shim import Shim, log, write_json
from astraeus.agent.runtime.shim import main as shim_main

REAPER = """
import os, select, signal, sys
hold = int(sys.argv[1])
signal.signal(signal.SIGCHLD, lambda *a: None)
while True:
    try:
        ready, _, _ = select.select([hold], [], [], 1.0)
    except InterruptedError:
        ready = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    if ready and not os.read(hold, 1):
        os._exit(0)
"""


class ContainerShim(Shim):
    def __init__(self, spec_path: str):
        super().__init__(spec_path)
        self.c: dict = self.spec["container"]
        self.cid: str = self.c["id"]
        self.layers = self.c["layers_dir"]  # <state>/containers/<id>: upper, work, rootfs, config.json
        self.image = None
        self.cache = None
        self.reaper_pid: int | None = None
        self.hold_w: int | None = None
        self.runc_cgroup: str | None = None  # the cgroup runc was told to make (in every hierarchy mounted here)

    # ------------------------------------------------------------------ helpers
    def runc(self, *args: str, **kw) -> subprocess.CompletedProcess:
        # The container inherits runc's signal dispositions and mask: the defaults, not the shim's.
        return subprocess.run([self.c.get("runc") or "runc", "--root", self.c["runc_root"], *args],
                              preexec_fn=_default_signals, **kw)

    def fail(self, message: str) -> None:
        """The attempt could not start: nothing of it is left (its layer, runc's record, the image's hold)."""
        try:
            self.kill_reaper()
            self.cleanup_container()
        except Exception as e:  # noqa: BLE001
            log(f"cleaning up after a failed start: {e}")
        super().fail(message)

    def phase(self, message: str) -> None:
        write_json(self.path("phase.json"), {"message": message, "time": time.time()})

    def setup_mounts(self) -> None:
        if os.geteuid() != 0:
            self.fail("the container runtime needs the agent to run as root")
        super().setup_mounts()

    def pull(self) -> None:
        from astraeus.agent.runtime.oci_images import ImageCache, PullError

        ref = self.spec.get("image") or ""
        auth = None
        auth_path = self.path("auth.json")
        try:
            with open(auth_path) as f:
                auth = json.load(f)
        except (OSError, ValueError):
            auth = None
        finally:
            try:
                os.unlink(auth_path)
            except OSError:
                pass
        self.cache = ImageCache(self.c["cache_dir"], int(self.c.get("cache_bytes") or 0),
                                list(self.c.get("insecure") or []))
        # A cached image starts at once; one that takes longer is being pulled: say so.
        timer = threading.Timer(0.3, self.phase, args=(f"Pulling image {ref}",))
        timer.daemon = True
        timer.start()
        try:
            self.image = self.cache.pull(ref, auth, holder=self.cid)  # held from the start: never evicted under us
        except PullError as e:
            timer.cancel()
            self.fail(str(e))
        except ValueError as e:
            timer.cancel()
            self.fail(f"image {ref!r}: {e}")
        timer.cancel()
        try:
            os.unlink(self.path("phase.json"))  # pulled: the worker is starting, nothing more to say
        except OSError:
            pass

    # ------------------------------------------------------------------ the root filesystem
    def _writable(self, upper: str, lower: str, path: str, uid: int, gid: int, mode: int) -> None:
        """Make `path` in the container a folder the worker owns, keeping what the image has in it: the folder
        and its parents are made in the upper layer (parents with the image's owner and mode, as overlayfs's
        copy-up would), so the image's files still show through."""
        parts = [p for p in path.split("/") if p and p != "."]
        if not parts or ".." in parts:
            return
        up, low = upper, lower
        for i, part in enumerate(parts):
            up, low = os.path.join(up, part), os.path.join(low, part)
            try:
                st = os.lstat(low)
                if not stat.S_ISDIR(st.st_mode):
                    return  # a file or a symlink in the image: leave it as the image has it
                owner, perm = (st.st_uid, st.st_gid), stat.S_IMODE(st.st_mode)
            except FileNotFoundError:
                owner, perm = (0, 0), 0o755
            last = i == len(parts) - 1
            if not os.path.isdir(up):
                os.mkdir(up)
            os.chown(up, *((uid, gid) if last else owner), follow_symlinks=False)
            os.chmod(up, mode if last else perm)

    def prepare_rootfs(self, env: dict, cwd: str) -> str:
        """Our own mount namespace, and the overlay of the image and a fresh upper layer mounted in it."""
        mounts.unshare_mount_namespace()
        shutil.rmtree(self.layers, ignore_errors=True)  # a fresh layer: never an earlier attempt's
        upper, work, rootfs = (os.path.join(self.layers, n) for n in ("upper", "work", "rootfs"))
        for d in (upper, work, rootfs):
            os.makedirs(d, mode=0o700, exist_ok=True)
        os.chmod(self.layers, 0o711)
        os.chmod(upper, 0o755)
        uid, gid = int(self.iso["uid"]), int(self.iso["gid"])
        lower = self.image.rootfs
        self._writable(upper, lower, "/tmp", 0, 0, 0o1777)
        os.chown(os.path.join(upper, "tmp"), 0, 0)
        os.chmod(os.path.join(upper, "tmp"), 0o1777)
        for p in dict.fromkeys((env.get("HOME") or "/root", cwd)):
            if p and p != "/" and not p.startswith(("/proc", "/sys", "/dev", "/run/astraeus")):
                self._writable(upper, lower, p, uid, gid, 0o755)
        mounts.mount("overlay", rootfs, "overlay", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"lowerdir={lower},upperdir={upper},workdir={work}")
        return rootfs

    def stage_drives(self) -> list[tuple[str, str, bool]]:
        """Each drive opened as the process runtime opens it (never through a symlink out of its granted folder)
        and bound to a staging folder only our namespace sees; runc binds that at the mount path."""
        binds = []
        staging = os.path.join(self.layers, "drives")
        for i, m in enumerate(self.spec.get("mounts") or []):
            what = f"drive at {m.get('mount_path')}"
            try:
                fd = mounts.open_drive_dir(m["host_path"], m.get("granted_root"), bool(m.get("create")),
                                          self.iso)
                try:
                    if not m.get("read_only"):
                        mounts.hand_over(fd, int(self.iso["uid"]), int(self.iso["gid"]), bool(m.get("create")))
                    target = os.path.join(staging, str(i))
                    os.makedirs(target, mode=0o700, exist_ok=True)
                    mounts.mount(f"/proc/self/fd/{fd}", target, None, mounts.MS_BIND)
                    if m.get("read_only"):
                        mounts.mount(None, target, None, mounts.MS_REMOUNT | mounts.MS_BIND | mounts.MS_RDONLY
                                     | mounts.MS_NOSUID | mounts.MS_NODEV)
                finally:
                    os.close(fd)
            except mounts.MountError as e:
                self.fail(f"{what}: {e}")
            except OSError as e:
                self.fail(f"{what}: {e.strerror or e}")
            binds.append((target, m["mount_path"], bool(m.get("read_only"))))
        for i, c in enumerate(self.spec.get("configs") or []):
            binds.append((os.path.join(self.path("configs"), str(i)), c["mount_path"], True))
        sig = self.signal_dir()
        binds.append((sig, oci_spec.SIGNAL_DIR, True))
        return self.nest(binds, staging)

    def work_dir(self) -> str:
        """`<attempt_dir>/work`, the worker's (0700) for its progress and checkpoint files, which the agent reads;
        its mount point is made in the stop reason folder first, which runc binds read-only before it."""
        work = self.path("work")
        try:
            os.makedirs(work, exist_ok=True)
            os.chown(work, int(self.iso["uid"]), int(self.iso["gid"]), follow_symlinks=False)
            os.chmod(work, 0o700)
            os.makedirs(os.path.join(self.signal_dir(), "work"), mode=0o755, exist_ok=True)
        except OSError as e:
            self.fail(f"working folder {work}: {e.strerror or e}")
        return work

    # A mount path inside another drive's: runc would make its mount point through that drive's bind, on the
    # host. The mount point is made in our namespace instead: the outer drive's folder is shown through a tmpfs
    # holding each of its entries (as the process runtime's view does), with the new mount point in it.
    def nest(self, binds: list[tuple[str, str, bool]], staging: str) -> list[tuple[str, str, bool]]:
        binds = sorted(binds, key=lambda b: len([p for p in b[1].split("/") if p]))  # outer ones first
        drives = [(src, os.path.normpath(dst)) for src, dst, _ in binds if src.startswith(staging + os.sep)]
        self._ours: set[int] = set()
        self._later: list[str] = []
        for src, dst, _ in binds:
            dst = os.path.normpath(dst)
            outer = max((d for d in drives if dst != d[1] and dst.startswith(d[1].rstrip("/") + "/")),
                        key=lambda d: len(d[1]), default=None)
            if outer is None:
                continue
            rel = os.path.relpath(dst, outer[1])
            try:
                self._make_in(outer[0], rel, os.path.isdir(src), f"mount path {dst}", outer[1])
            except OSError as e:
                self.fail(f"mount path {dst}: {e.strerror or e}")
        for d in self._later:
            mounts.mount(None, d, None, mounts.MS_REMOUNT | mounts.MS_BIND | mounts.MS_RDONLY | mounts.MS_NOSUID
                         | mounts.MS_NODEV)
        return binds

    def _make_in(self, root: str, rel: str, is_dir: bool, what: str, outer: str) -> None:
        cur = root
        parts = [p for p in rel.split("/") if p and p != "."]
        for i, part in enumerate(parts):
            nxt, last = os.path.join(cur, part), i == len(parts) - 1
            try:
                st = os.lstat(nxt)
            except FileNotFoundError:
                st = None
            if st is not None:
                if stat.S_ISLNK(st.st_mode):
                    self.fail(f"{what} goes through a symlink in the drive at {outer}; symlinks are refused there")
                if not last and not stat.S_ISDIR(st.st_mode):
                    self.fail(f"{what}: {os.path.join(outer, *parts[:i + 1])} is not a folder")
                cur = nxt
                continue
            if os.stat(cur).st_dev not in self._ours:
                self._explode(cur)
            if last and not is_dir:
                with open(nxt, "w"):
                    pass
            else:
                os.mkdir(nxt, 0o755)
            cur = nxt

    def _explode(self, d: str) -> None:
        stage = os.path.join(self.layers, f"stage-{len(self._later)}")
        os.makedirs(stage, mode=0o700, exist_ok=True)
        st = os.stat(d)
        mounts.mount(d, stage, None, mounts.MS_BIND | mounts.MS_REC)
        mounts.mount("tmpfs", d, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"mode={stat.S_IMODE(st.st_mode):o},uid={st.st_uid},gid={st.st_gid}")
        self._ours.add(os.stat(d).st_dev)
        for e in os.scandir(stage):
            mounts._bind_entry(e, os.path.join(d, e.name))
        mounts.umount(stage)
        os.rmdir(stage)
        self._later.append(d)

    def gpu_edits(self):
        """The worker's real GPUs: CDI edits, or device nodes and driver files (astraeus.agent.runtime.gpu_edits).
        Simulated GPUs have nothing to bind: their assignment is in the environment only."""
        from astraeus.agent.runtime.gpu_edits import device_node, gpu_edits

        edits = gpu_edits(list(self.c.get("gpu_indices") or []), list(self.c.get("gpu_minors") or []),
                          self.c.get("device_dir") or "/dev")
        devices = []
        for d in edits.devices:
            node = device_node(d["host_path"])
            if node is not None:
                devices.append({"path": d["path"], **node})
        return edits, devices

    # ------------------------------------------------------------------ the PID namespace
    def start_reaper(self) -> str:
        """PID 1 of a new PID namespace; the container joins it. Returns the namespace's path."""
        hold_r, self.hold_w = os.pipe2(os.O_CLOEXEC)
        pid_r, pid_w = os.pipe2(os.O_CLOEXEC)
        mid = os.fork()
        if mid == 0:  # unshare here, not in the shim: runc's own children must stay in the host's namespace
            try:
                os.close(self.hold_w)
                mounts.unshare_pid_namespace()
                r = os.fork()
                if r == 0:
                    os.set_inheritable(hold_r, True)
                    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD):
                        signal.signal(s, signal.SIG_DFL)
                    signal.set_wakeup_fd(-1)
                    # what the worker sees as its PID 1: "python -I -S -c <one line> <fd>"
                    os.execve(sys.executable, [sys.executable, "-I", "-S", "-c",
                                               "import os; exec(os.environ['ASTRAEUS_INIT'])", str(hold_r)],
                              {"ASTRAEUS_INIT": REAPER})
                os.write(pid_w, str(r).encode())
            finally:
                os._exit(0)
        os.close(hold_r)
        os.close(pid_w)
        os.waitpid(mid, 0)
        data = os.read(pid_r, 32)
        os.close(pid_r)
        if not data:
            self.fail("cannot create the worker's PID namespace")
        self.reaper_pid = int(data)
        self.init_pid = None
        return f"/proc/{self.reaper_pid}/ns/pid"

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        spec = self.spec
        self.pull()
        cfg = self.image.config
        argv = oci_spec.process_args(spec.get("command"), spec.get("args"), cfg.entrypoint, cfg.cmd)
        if not argv:
            self.fail(f"the run has no command and the image {spec.get('image')} has no entrypoint or cmd")
        gpus, devices = self.gpu_edits()
        env = oci_spec.merge_env(cfg.env, {**gpus.env, **(spec.get("env") or {})})
        env = oci_spec.with_path_prepended(env, gpus.path_prepend)
        if spec.get("tools") and os.path.isdir(spec["tools"]):  # srun and scontrol first on PATH
            env = oci_spec.with_path_prepended(env, {"PATH": oci_spec.TOOLS_DIR})
        env.setdefault("HOME", "/root")
        cwd = cfg.working_dir or "/"
        try:
            rootfs = self.prepare_rootfs(env, cwd)
        except (OSError, mounts.MountError) as e:
            self.fail(f"cannot make the container's root filesystem: {getattr(e, 'strerror', None) or e}")
        binds = self.stage_drives() + [b for b in gpus.binds if os.path.exists(b[0])]
        if spec.get("tools") and os.path.isdir(spec["tools"]):
            binds.append((spec["tools"], oci_spec.TOOLS_DIR, True))
        pidns = self.start_reaper()
        lim = spec.get("limits") or {}
        # with a network of its own, its resolvers come as a config at /etc/resolv.conf (ProcessRuntime.start)
        # a multi-machine job's /etc/hosts comes as a config too (process.job_hosts)
        own = {c.get("mount_path") for c in spec.get("configs") or []}
        host_files = [f for f in ("/etc/hosts", "/etc/resolv.conf") if os.path.isfile(f) and f not in own
                      and not (f == "/etc/resolv.conf" and self.iso.get("netns"))]
        self.runc_cgroup = self.cg.name if self.cg else self.cid
        config = oci_spec.build_config(
            rootfs=rootfs, argv=argv, env=env, cwd=cwd, uid=int(self.iso["uid"]), gid=int(self.iso["gid"]),
            hostname=socket.gethostname(), pid_namespace=pidns,
            cgroups_path=f"/astraeus/{self.runc_cgroup}",
            shm_bytes=int(self.c.get("shm_bytes") or 64 << 20), binds=binds, devices=devices, hooks=gpus.hooks,
            host_files=host_files, **{k: lim.get(k) for k in ("memory_bytes", "cpu_cores", "pids_max")},
            nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[1], network=self.iso.get("netns"),
            work=self.work_dir())
        with open(os.path.join(self.layers, "config.json"), "w") as f:
            json.dump(config, f)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid_file = os.path.join(self.layers, "container.pid")
        runc_log = os.path.join(self.layers, "runc.log")
        self.runc("delete", "--force", self.cid, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)  # an earlier shim's record of this id
        p = self.runc("--log", runc_log, "--log-format", "json", "run", "--detach", "--pid-file", pid_file,
                      "--bundle", self.layers, self.cid,
                      stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, pass_fds=())
        os.close(out_w)
        os.close(err_w)
        if p.returncode != 0:
            os.close(out_r)
            os.close(err_r)
            msg = self.runc_error(runc_log, argv[0])
            self.cleanup_cgroup()
            self.fail(msg)
        with open(pid_file) as f:
            pid = int(f.read().strip())
        self.record_started(pid, out_r, err_r, container=self.cid, image_digest=self.image.digest)
        # Drain the container's output from here on (the pipes' buffers would block a chatty command).

    @staticmethod
    def runc_error(runc_log: str, command: str) -> str:
        """runc's reason, in the words the process runtime uses where they mean the same."""
        text = ""
        try:
            with open(runc_log, errors="replace") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("level") in ("error", "fatal"):
                        text = str(rec.get("msg") or "")
        except OSError:
            pass
        if "executable file not found" in text or re.search(r"exec: .*no such file or directory", text):
            return f"no such command: {command}"
        if re.search(r"exec: .*permission denied", text):
            return f"permission denied: {command}"
        text = re.sub(r"^runc (run|create) failed: ", "", text)
        return f"the container could not start: {text or 'runc failed'}"

    # ------------------------------------------------------------------ the tree
    def descendants(self) -> list[int]:
        """Everything of the worker's that is still alive, but for the reaper (it holds the namespace open)."""
        return [p for p in super().descendants() if p != self.reaper_pid]

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid and self.status is None:
                self.status = status
                self.finished_at = time.time()
            elif pid == self.reaper_pid:
                self.reaper_pid = None

    def kill_tree(self) -> None:
        super().kill_tree()
        self.kill_reaper()

    def kill_reaper(self) -> None:
        """PID 1 of the worker's namespace: when it ends, the kernel kills whatever is left in there."""
        if self.hold_w is not None:
            os.close(self.hold_w)
            self.hold_w = None
        if self.reaper_pid:
            self.sig(self.reaper_pid, signal.SIGKILL)
            try:
                os.waitpid(self.reaper_pid, 0)
            except ChildProcessError:
                pass
            self.reaper_pid = None

    def cleanup_container(self) -> None:
        self.runc("delete", "--force", self.cid, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
        if self.runc_cgroup:  # what runc's delete removes, but not when its record was wiped with the state dir
            cgroups.remove_everywhere(cgroups.Hierarchies(), self.runc_cgroup)
        # The attempt's layer is discarded, but only once nothing is mounted under it: a drive staged there is
        # the workspace's own folder, which a removal through the mount would empty.
        if unmount_all(self.layers):
            shutil.rmtree(self.layers, ignore_errors=True)
        else:
            log(f"mounts are left under {self.layers}: not removing it")
        if self.cache is not None and self.image is not None:
            try:
                self.cache.release(self.image.digest, self.cid)
                self.cache.evict()
            except Exception as e:  # noqa: BLE001
                log(f"image cache: {e}")

    def finish(self) -> None:
        self.kill_reaper()
        self.cleanup_container()
        super().finish()


def _default_signals() -> None:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def mount_points_under(path: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points at or below `path` in this mount namespace, deepest first."""
    path = os.path.realpath(path)
    out = []
    try:
        with open(mountinfo) as f:
            for line in f:
                mp = line.split()[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
                    .replace("\\134", "\\")
                if mp == path or mp.startswith(path.rstrip("/") + "/"):
                    out.append(mp)
    except OSError:
        return []
    return sorted(set(out), key=len, reverse=True)


def unmount_all(path: str) -> bool:
    """Unmount everything at or below `path` (stacked mounts too). True when nothing is mounted there any more."""
    for _ in range(10):
        left = mount_points_under(path)
        if not left:
            return True
        for mp in left:
            try:
                mounts.umount(mp)
            except OSError:
                pass
    return not mount_points_under(path)



def main(argv: list[str], detached: bool = False) -> None:
    """`python -m astraeus.agent.runtime.container_shim <spec.json>`: the shim's main with ContainerShim
    supervising the worker (the shim module never imports this one: it is the lower of the two)."""
    mounts.drop_template()  # runc makes the container's view: the prepared one would only be held open
    shim_main(argv, detached, ContainerShim)


if __name__ == "__main__":
    main(sys.argv)
