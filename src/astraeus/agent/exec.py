"""The agent's side of exec, shell and port-forward sessions (astraeus.server.exec_sessions pairs them with users).

A thread long-polls GET /api/v1/agent/exec-sessions; each session gets a thread that opens a WebSocket back to
the control plane (agents only make outbound connections) and runs the command inside the worker's own view:
the process runtime's worker through nsenter (its mount, PID, IPC and network namespaces and root, its cgroup,
its uid and gid, its environment), a container through `runc exec`. With a TTY the command gets a real
pseudo-terminal here. A port-forward connects to the port from inside the worker's network namespace.
When the worker is asked to stop (preempted, deleted, at its time limit), a command's session ends at once with an
`error` frame that gives the stop's reason, so the user's terminal says why before it closes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pty
import signal
import socket
import struct
import subprocess
import termios
import threading

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from astraeus import protocol as P
from astraeus.agent.client import Backoff
from astraeus.agent.runtime import mounts

log = logging.getLogger("astraeus.agent.exec")
CHUNK = 65536


class Refused(Exception):
    """The session cannot start: the message says why, in words the user sees."""


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().split(b"\0")
    env = {}
    for item in items:
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _cgroup_procs(pid: int) -> str | None:
    """The cgroup v2 `cgroup.procs` of `pid`'s cgroup, so that the session's processes count in the worker's limits."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    path = "/sys/fs/cgroup" + line[3:].strip()
                    procs = os.path.join(path, "cgroup.procs")
                    return procs if os.path.exists(procs) else None
    except OSError:
        return None
    return None


STOP_POLL_SECONDS = 0.2  # how often a session looks for its worker's stop request


def stop_message(reason: str | None) -> str:
    """What a session's user reads when the worker it is in is stopped."""
    return f"{reason or 'the worker is being stopped'}: the worker is stopping, so this session ends"


class Target:
    """Where a session runs: the worker attempt's main process, its user, and (containers) its runc container."""

    def __init__(self, runtime, worker: str, attempt: int):
        d = runtime.dir(worker, attempt)
        self.stop_file = os.path.join(d, "stop.json")  # the agent's stop request (its reason) for this attempt
        started = _read_json(os.path.join(d, "started.json"))
        self.pid = started.get("pid")
        if not self.pid or not os.path.exists(f"/proc/{self.pid}"):
            raise Refused(f"worker {P.identity_name(worker)} (attempt {attempt}) is not running on this machine")
        iso = (_read_json(os.path.join(d, "spec.json")).get("isolation") or {})
        self.uid, self.gid = iso.get("uid"), iso.get("gid")
        self.runc = getattr(runtime, "runc", None) if hasattr(runtime, "container_id") else None
        self.container = runtime.container_id(worker, attempt) if self.runc else None
        self.runc_root = getattr(runtime, "runc_root", None)

    def argv(self, command: list[str], tty: bool) -> list[str]:
        if self.container:
            return [self.runc, "--root", self.runc_root, "exec", *(["-t"] if tty else []), self.container, *command]
        ids = [f"--setuid={self.uid}", f"--setgid={self.gid}"] if self.uid is not None else []
        # with a TTY: a session of its own inside the worker's PID namespace, the terminal its controlling one (a
        # shell's job control then finds every process group it deals with)
        lead = ["setsid", "--ctty"] if tty else []
        if command[:1] and command[0].startswith("-"):  # never read as one of nsenter's (or setsid's) options
            command = ["env", "--", *command]
        return ["nsenter", f"--target={self.pid}", "--mount", "--pid", "--ipc", "--net", "--root", "--wd", *ids,
                *lead, *command]

    def env(self) -> dict[str, str]:
        return {} if self.container else _environ(self.pid)

    def shell(self) -> list[str]:
        sh = self.env().get("SHELL") or "/bin/sh"
        return [sh, "-i"] if sh.endswith("sh") else ["/bin/sh", "-i"]


def _winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", max(rows, 1), max(cols, 1), 0, 0))


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


class Session:
    def __init__(self, ws: ClientConnection, runtime, info: P.ExecSession):
        self.ws, self.runtime, self.info = ws, runtime, info
        self.send_lock = threading.Lock()

    def send(self, data: bytes | str) -> None:
        with self.send_lock, contextlib.suppress(ConnectionClosed, OSError):
            self.ws.send(data)

    def control(self, **kw) -> None:
        self.send(P.ExecControl(**kw).model_dump_json(exclude_none=True))

    def run(self) -> None:
        try:
            target = Target(self.runtime, self.info.worker, self.info.attempt)
            if self.info.port is not None:
                return self.forward(target)
            self.command(target)
        except Refused as e:
            self.control(type="error", message=str(e))
        except Exception as e:  # the user hears why rather than a silent close
            log.exception("exec session %s", self.info.id)
            self.control(type="error", message=f"the session failed on the machine: {e}")
        finally:
            with contextlib.suppress(Exception):
                self.ws.close()

    # ------------------------------------------------------------------ a command, with or without a TTY
    def command(self, target: Target) -> None:
        cmd = list(self.info.command) or target.shell()
        argv = target.argv(cmd, self.info.tty)
        procs = None if target.container else _cgroup_procs(target.pid)

        def enter():  # in the child, before nsenter: into the worker's cgroup
            if procs:
                with contextlib.suppress(OSError), open(procs, "w") as f:
                    f.write("0")

        if self.info.tty:
            master, slave = pty.openpty()
            _winsize(slave, self.info.cols, self.info.rows)
            proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=target.env(),
                                    start_new_session=True, preexec_fn=enter, close_fds=True)
            os.close(slave)
            outs = [(master, P.EXEC_STDOUT)]
            write_in = lambda b: os.write(master, b)  # noqa: E731
            end_in = lambda: os.write(master, b"\x04")  # noqa: E731  Ctrl-D: the shell's end of input
        else:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=target.env(), start_new_session=True, preexec_fn=enter, close_fds=True)
            outs = [(proc.stdout.fileno(), P.EXEC_STDOUT), (proc.stderr.fileno(), P.EXEC_STDERR)]
            write_in = lambda b: (proc.stdin.write(b), proc.stdin.flush())  # noqa: E731
            end_in = proc.stdin.close
        readers = [threading.Thread(target=self._pump_out, args=(fd, stream), daemon=True) for fd, stream in outs]
        for t in readers:
            t.start()
        inbound = threading.Thread(target=self._pump_in, args=(proc, write_in, end_in,
                                                               master if self.info.tty else None), daemon=True)
        inbound.start()
        stopped = self._wait(proc, target)
        if stopped is not None:  # the user hears why, then the session's processes go (_pump_in: SIGHUP)
            self.control(type="error", message=stop_message(stopped))
            with contextlib.suppress(Exception):
                self.ws.close()
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGHUP)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if self.info.tty:
                os.close(master)
            return
        rc = proc.returncode
        for t in readers:
            t.join(timeout=5)
        if self.info.tty:
            os.close(master)
        self.control(type="exit", code=_exit_code(rc))

    @staticmethod
    def _wait(proc: subprocess.Popen, target: Target) -> str | None:
        """Until the command ends (None) or its worker is asked to stop (the stop's reason, "" when it gives none)."""
        while True:
            try:
                proc.wait(timeout=STOP_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            if os.path.exists(target.stop_file):
                return _read_json(target.stop_file).get("reason") or ""
            if proc.returncode is not None:
                return None

    def _pump_out(self, fd: int, stream: int) -> None:
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:  # EIO: the pty's last holder has closed it
                return
            if not data:
                return
            self.send(bytes([stream]) + data)

    def _pump_in(self, proc: subprocess.Popen, write_in, end_in, master: int | None) -> None:
        try:
            for msg in self.ws:
                if isinstance(msg, bytes):
                    if msg[:1] == bytes([P.EXEC_STDIN]):
                        with contextlib.suppress(OSError, ValueError):
                            write_in(msg[1:])
                    continue
                c = P.ExecControl.model_validate_json(msg)
                if c.type == "resize" and master is not None and c.cols and c.rows:
                    _winsize(master, c.cols, c.rows)
                elif c.type == "eof":
                    with contextlib.suppress(OSError, ValueError):
                        end_in()
        except (ConnectionClosed, OSError, ValueError):
            pass
        if proc.poll() is None:  # the user has gone: the session's processes go too
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGHUP)

    # ------------------------------------------------------------------ port-forward
    def forward(self, target: Target) -> None:
        sock = _connect_in(target.pid, self.info.port)
        done = threading.Event()

        def out():
            while True:
                try:
                    data = sock.recv(CHUNK)
                except OSError:
                    data = b""
                if not data:
                    break
                self.send(bytes([P.EXEC_STDOUT]) + data)
            done.set()
            with contextlib.suppress(Exception):
                self.ws.close()

        threading.Thread(target=out, daemon=True).start()
        try:
            for msg in self.ws:
                if isinstance(msg, bytes) and msg[:1] == bytes([P.EXEC_STDIN]):
                    sock.sendall(msg[1:])
                elif isinstance(msg, str) and P.ExecControl.model_validate_json(msg).type == "eof":
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_WR)
        except (ConnectionClosed, OSError):
            pass
        done.wait(5)
        sock.close()


def _connect_in(pid: int, port: int) -> socket.socket:
    """A TCP connection to 127.0.0.1:port in the network namespace of `pid`, made from a thread of its own that
    enters it (a thread's namespace is its own; the socket keeps the namespace it was made in)."""
    out: dict = {}

    def go():
        try:
            with open(f"/proc/{pid}/ns/net") as ns:
                mounts.setns(ns.fileno(), mounts.CLONE_NEWNET)
            out["sock"] = socket.create_connection(("127.0.0.1", port), timeout=10)
            out["sock"].settimeout(None)
        except OSError as e:
            out["error"] = e

    t = threading.Thread(target=go, name="exec-netns", daemon=True)
    t.start()
    t.join()
    if "sock" not in out:
        raise Refused(f"nothing answers on port {port} inside the worker ({out['error'].strerror or out['error']}): "
                      "is the server listening on that port (on 127.0.0.1 or 0.0.0.0)?")
    return out["sock"]


class ExecSessions:
    """The long-poll thread and one thread per session (astraeus.agent.agent starts it)."""

    def __init__(self, agent):
        self.agent = agent

    def ws_url(self, sid: str) -> str:
        base = self.agent.control_plane.base
        return base.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + \
            f"/exec-sessions/{sid}?machine={self.agent.name}"

    def loop(self) -> None:
        agent, backoff = self.agent, Backoff()
        with agent.control_plane.http(timeout=agent.poll_wait + 5) as client:
            while not agent.stopping.is_set():
                if not agent.registered.is_set():
                    agent.stopping.wait(1)
                    continue
                try:
                    r = client.get(agent.control_plane.base + "/exec-sessions",
                                   params={"machine": agent.name, "wait": agent.poll_wait})
                    if r.status_code == 404 and "exec-sessions" not in r.text:  # an older control plane
                        agent.stopping.wait(60)
                        continue
                    r.raise_for_status()
                    for info in P.ExecSessions.model_validate(r.json()).sessions:
                        threading.Thread(target=self.serve, args=(info,), name=f"exec-{info.id[:8]}",
                                         daemon=True).start()
                    backoff.reset()
                except (httpx.HTTPError, ValueError) as e:
                    log.debug("exec sessions poll: %s", e)
                    if agent.stopping.wait(backoff.next()):
                        return

    def serve(self, info: P.ExecSession) -> None:
        cp = self.agent.control_plane
        try:
            ws = connect(self.ws_url(info.id), additional_headers={"Authorization": f"Bearer {cp.credential or cp.token}"},
                         open_timeout=10, max_size=None)
        except Exception as e:
            log.warning("exec session %s: cannot open its WebSocket: %s", info.id, e)
            return
        Session(ws, self.agent.runtime, info).run()
