"""A pre-started shim launcher (a fork server): one per ProcessRuntime, started with the shim's modules imported,
it forks a worker's shim on request instead of the agent starting a new Python interpreter for each worker.

Why: `python -m astraeus.agent.runtime.shim` costs an interpreter start and the shim's imports (psutil, json,
ctypes ...) for each worker, most of a trivial run's cost on a small machine. A fork of a process that has them
imported costs far less.

What the forked child does is exactly what `python -m astraeus.agent.runtime.shim SPEC` does when the agent
starts it with subprocess.Popen(env=ENV, stdin/stdout=/dev/null, stderr=shim.log, cwd="/",
start_new_session=True, close_fds=True): it gets the same environment (os.environ, and what /proc/PID/environ
shows: the agent finds its shims by ASTRAEUS_SHIM_OWNER/ASTRAEUS_SHIM_ID there, see ProcessRuntime.adopt), the
same descriptors, its own session, and runs the shim. The forked child is the shim itself, with no double fork:
the launcher ignores SIGCHLD, so the kernel reaps each shim when it ends (the child sets SIGCHLD back to its
default first thing), and when the launcher ends its shims are reparented as a double-forked shim's parent would
be; one Python fork and exit less per worker. The launcher answers as soon as it has forked (what the shim did is
read from its files, as after a Popen): a start waits for nothing of the shim's.

/proc/PID/environ of a forked process shows its parent's environment block, not os.environ: the launcher is
started with a blank slot variable (ASTRAEUS_SHIM_LAUNCHER=<spaces>) and the child writes its own variables over that
block in place (as setproctitle does for the command line). When a child's environment does not fit the slot,
the child execs the shim instead (the old way, an interpreter start), so nothing depends on the slot's size.

Protocol (the agent's side is `Launcher`): one JSON line per request on the launcher's stdin,
{"argv": [...], "env": {...}, "stderr": PATH, "module": the shim's module}; one line back on its stdout, the shim's
pid once it is forked (-1: the request was not JSON). EOF on stdin (the agent gone): the launcher exits; the shims it forked do not depend on
it. Any failure on the agent's side (the launcher not started, dead, a broken pipe, a garbled answer) makes
ProcessRuntime fall back to starting the shim with Popen.

The launcher holds only what the shims need (each module it holds makes every fork, and every forked process's
exit, dearer for the machine): the shim's modules, and the container shim's only for a ContainerRuntime's
launcher (`Launcher(preload=...)`, passed on its command line). This module's agent side imports subprocess and
threading when it is used, not at the top, so that the launcher process does not hold them.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from astraeus import envvars  # not astraeus.settings: the launcher holds no pydantic

SLOT_VAR = "ASTRAEUS_SHIM_LAUNCHER"  # in the launcher: a blank slot; in the agent: `0` turns the launcher off
SLOT_BYTES = 8192
LAUNCHER_MODULE = "astraeus.agent.runtime.launcher"
SHIM_MODULE = "astraeus.agent.runtime.shim"


# ------------------------------------------------------------------ the launcher process
def _env_block() -> tuple[int, int] | None:
    """This process's environment block (env_start, env_end in /proc/self/stat, fields 50 and 51)."""
    from astraeus.agent.runtime.shim import stat_fields  # the launcher holds the shim's modules anyway

    fields = stat_fields("self")
    try:
        return int(fields[47]), int(fields[48])
    except (TypeError, ValueError, IndexError):
        return None


def _set_proc_environ(env: dict[str, str], block: tuple[int, int] | None) -> bool:
    """Write `env` over this process's original environment block, so /proc/self/environ shows it."""
    if block is None:
        return False
    start, end = block
    data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    if len(data) >= end - start:
        return False
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
    return True


def _child(req: dict, block: tuple[int, int] | None, template: tuple[int, str] | None = None) -> None:
    """In the forked child: become `python -m MODULE ARGV` (MODULE: the request's shim module,
    astraeus.agent.runtime.shim or .container_shim) as Popen would have started it, with the prepared view
    (`template`, astraeus.agent.runtime.mounts.TEMPLATE) for its worker."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the launcher's SIG_IGN, which an exec would keep
        env = {str(k): str(v) for k, v in req["env"].items()}
        argv = [str(a) for a in req["argv"]]
        module = str(req.get("module") or SHIM_MODULE)
        errf = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(errf, 2)
        # close_fds: nothing of the launcher's (its pipes to the agent) stays open, but the prepared view's
        if template is None:
            os.closerange(3, 65536)
        else:
            os.closerange(3, template[0])
            os.closerange(template[0] + 1, 65536)
        os.chdir("/")
        os.setsid()
        if not _set_proc_environ(env, block):
            # does not fit the slot: the old way, an interpreter of its own
            os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)
        envvars.replace(env)
        import importlib

        from astraeus.agent.runtime import mounts

        mounts.TEMPLATE = template
        entry = importlib.import_module(module)  # imported already: SHIM_MODULES, or the launcher's preload

        # this child is the shim (in its own session already): it returns here when it ends
        entry.main([module, *argv], detached=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001
        try:
            import traceback

            os.write(2, traceback.format_exc().encode(errors="replace"))
        except OSError:
            pass
    finally:
        os._exit(code)


# What every shim needs, imported once in the launcher (each fork has them); a ContainerRuntime's launcher also
# imports the container shim (its command line names the modules to add).
SHIM_MODULES = ("astraeus.agent.runtime.cgroups", "astraeus.agent.runtime.mounts", SHIM_MODULE)


def serve(preload: list[str] | tuple[str, ...] = ()) -> None:
    import importlib

    for name in (*SHIM_MODULES, *preload):
        importlib.import_module(name)

    block = _env_block()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the shims it forks are reaped by the kernel when they end
    inp = sys.stdin.buffer
    out = sys.stdout.buffer
    template: tuple[int, str] | None = None
    failed = False
    while True:
        line = inp.readline()
        if not line:
            return  # the agent is gone
        try:
            req = json.loads(line)
        except ValueError:
            out.write(b"-1\n")
            out.flush()
            continue
        if os.geteuid() == 0 and not failed:
            template, failed = _template(template)
        sys.stderr.flush()
        pid = _native(req, template) if NATIVE and template is not None else None
        if pid is None:
            pid = os.fork()
        if pid == 0:
            _child(req, block, template)
        out.write(f"{pid}\n".encode())
        out.flush()


# The per-worker supervisor in C (astraeus.agent.runtime.native), when the agent gave its path.
NATIVE = envvars.get("ASTRAEUS_NATIVE_SHIM") or None


def _native(req: dict, template: tuple[int, str]) -> int | None:
    """Start the C supervisor for this request if it fits the worker (its pid), else None: the Python shim is
    forked. Anything that goes wrong here is written to the launcher's log, and the Python shim does it again."""
    from astraeus.agent.runtime import native

    try:
        return native.start(NATIVE, req, template)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write(f"launcher: the native shim cannot start this worker ({e}); forking the Python shim\n")
        return None


def _template(template: tuple[int, str] | None) -> tuple[tuple[int, str] | None, bool]:
    """The workers' view prepared once (astraeus.agent.runtime.mounts.prepare_template), made again when the
    host's mounts or top-level entries changed since; (None, True) when it cannot be made here (each worker's
    view is then built from scratch, as before)."""
    from astraeus.agent.runtime import mounts

    try:
        if template is not None and mounts.host_signature() == template[1]:
            return template, False
        made = mounts.prepare_template()
    except OSError as e:
        sys.stderr.write(f"launcher: {e}; building each worker's view from scratch\n")
        made = None
    if template is not None:
        os.close(template[0])
    return made, made is None


# ------------------------------------------------------------------ the agent's side
class Launcher:
    """The agent's handle on its launcher process: started at the first use, restarted if it died. `preload`: the
    modules its shims need beyond SHIM_MODULES (a container runtime's: the container shim)."""

    def __init__(self, env: dict[str, str], stderr_path: str | None = None, preload: tuple[str, ...] = ()):
        import threading

        self.env = env
        self.stderr_path = stderr_path
        self.preload = tuple(preload)
        self.proc = None  # the launcher's subprocess.Popen once started
        self.lock = threading.Lock()
        self.failures = 0

    def _ensure(self):  # -> subprocess.Popen
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        if self.proc is not None:
            self._close()
        env = dict(self.env, **{SLOT_VAR: " " * SLOT_BYTES})
        err = open(self.stderr_path, "ab") if self.stderr_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", LAUNCHER_MODULE, *self.preload], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd="/",
                                         start_new_session=True, close_fds=True)
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        return self.proc

    def launch(self, argv: list[str], env: dict[str, str], stderr_path: str, module: str = SHIM_MODULE) -> int:
        """Start the shim (`module`'s main: SHIM_MODULE, or a container worker's container_shim): the pid of the
        launcher's child that becomes it (the shim forks away from that child at once). Raises OSError when the
        launcher fails."""
        with self.lock:
            if self.failures >= 3:
                raise OSError("the shim launcher failed three times; not using it")
            try:
                p = self._ensure()
                p.stdin.write(json.dumps({"argv": argv, "env": env, "stderr": stderr_path, "module": module}).encode()
                              + b"\n")
                p.stdin.flush()
                answer = p.stdout.readline()
                if not answer:
                    raise OSError("the shim launcher exited")
                code = int(answer)
                self.failures = 0
                return code
            except (OSError, ValueError) as e:
                self.failures += 1
                self._close()
                raise OSError(f"shim launcher: {e}") from None

    def _close(self) -> None:
        import subprocess

        p, self.proc = self.proc, None
        if p is None:
            return
        for f in (p.stdin, p.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def close(self) -> None:
        with self.lock:
            self._close()


if __name__ == "__main__":
    serve(sys.argv[1:])
