"""`astra astraeus exec`, `shell` and `port-forward`: sessions into a running worker, streamed through the control
plane over a WebSocket ($API/runs/{name}/exec, /port-forward; astraeus.protocol, "exec")."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
from urllib.parse import urlencode

import typer

from astraeus.cli.client import ApiError, api_urls, load_config

EXEC_STDIN, EXEC_STDOUT, EXEC_STDERR = 0, 1, 2  # astraeus.protocol's, without importing pydantic here


def _url(path: str, params: list[tuple[str, str]]) -> tuple[str, dict[str, str]]:
    cfg = load_config()
    base = api_urls(cfg.api)[0]
    base = base.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return f"{base}{path}?{urlencode(params)}", {"Authorization": f"Bearer {cfg.token}"}


def _open(path: str, params: list[tuple[str, str]]):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url, headers = _url(path, params)
    try:
        return connect(url, additional_headers=headers, max_size=None, open_timeout=30)
    except InvalidStatus as e:
        r = e.response
        try:
            message = json.loads(r.body.decode())["message"]
        except (ValueError, KeyError, AttributeError):
            message = f"the control plane answered {r.status_code}"
        raise ApiError(message, status=r.status_code) from None
    except OSError as e:
        raise ApiError(f"cannot reach the control plane at {url.split('?')[0]}: {e}") from None


def _session(run: str, worker: int, command: list[str], tty: bool, stdin: bool = True) -> int:
    """Stream a command's session: this terminal's input to it (`stdin`: else none), its output here; its exit code
    back."""
    from websockets.exceptions import ConnectionClosed

    params = [("worker", str(worker)), ("tty", "true" if tty else "false")] + [("command", c) for c in command]
    if tty:
        size = os.get_terminal_size(sys.stdout.fileno()) if sys.stdout.isatty() else os.terminal_size((80, 24))
        params += [("cols", str(size.columns)), ("rows", str(size.lines))]
    ws = _open(f"/runs/{run}/exec", params)
    lock = threading.Lock()

    def send(data) -> None:
        with lock, contextlib.suppress(ConnectionClosed, OSError):
            ws.send(data)

    def stdin_pump() -> None:
        fd = sys.stdin.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                if not tty:
                    send(json.dumps({"type": "eof"}))
                return
            send(bytes([EXEC_STDIN]) + data)

    saved = None
    if tty and sys.stdin.isatty():
        import termios
        import tty as ttymod

        saved = termios.tcgetattr(sys.stdin.fileno())
        ttymod.setraw(sys.stdin.fileno())  # Ctrl-C and Ctrl-D go to the worker's terminal, not to astra

        def on_resize(*_):
            s = os.get_terminal_size(sys.stdout.fileno())
            send(json.dumps({"type": "resize", "cols": s.columns, "rows": s.lines}))

        signal.signal(signal.SIGWINCH, on_resize)
    if stdin:
        threading.Thread(target=stdin_pump, daemon=True).start()
    elif not tty:  # no input for it (srun's tasks past the first): its input ends at once
        send(json.dumps({"type": "eof"}))
    code, error = None, None
    try:
        for msg in ws:
            if isinstance(msg, bytes):
                out = sys.stderr if msg[:1] == bytes([EXEC_STDERR]) else sys.stdout
                out.buffer.write(msg[1:])
                out.buffer.flush()
                continue
            c = json.loads(msg)
            if c.get("type") == "exit":
                code = int(c.get("code") or 0)
                break
            if c.get("type") == "error":
                error = c.get("message") or "the session failed"
                break
    except ConnectionClosed:
        pass
    finally:
        if saved is not None:
            import termios

            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
        with contextlib.suppress(Exception):
            ws.close()
    if error:  # e.g. the worker was preempted: why, on a line of its own after the shell's last output
        if tty:
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise ApiError(error)
    if code is None:
        raise ApiError("the session ended before the command did (the control plane or the worker's machine went "
                       "away): run it again")
    return code


def _forward_one(conn: socket.socket, run: str, worker: int, port: int) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        ws = _open(f"/runs/{run}/port-forward", [("worker", str(worker)), ("port", str(port))])
    except ApiError as e:
        print(f"astra: port-forward: {e.message}", file=sys.stderr)
        conn.close()
        return

    def inbound() -> None:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(ConnectionClosed, OSError):
                    ws.send(json.dumps({"type": "eof"}))
                return
            try:
                ws.send(bytes([EXEC_STDIN]) + data)
            except (ConnectionClosed, OSError):
                return

    threading.Thread(target=inbound, daemon=True).start()
    try:
        for msg in ws:
            if isinstance(msg, bytes):
                conn.sendall(msg[1:])
            elif json.loads(msg).get("type") == "error":
                print(f"astra: port-forward: {json.loads(msg).get('message')}", file=sys.stderr)
                break
    except (ConnectionClosed, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            conn.close()
        with contextlib.suppress(Exception):
            ws.close()


def register(app: typer.Typer, guard) -> None:
    """Add exec, shell and port-forward to `astra astraeus` (`guard`: astra's one-line error handling)."""

    @app.command("exec")
    @guard()
    def exec_(run: str = typer.Argument(..., help="the run"),
              command: list[str] = typer.Argument(..., help="the command and its arguments, after --"),
              worker: int = typer.Option(0, "--worker", "-w", help="the worker's index in the run"),
              tty: bool = typer.Option(False, "--tty", "-t", help="give the command a terminal")):
        """Run a command inside a running worker (its namespaces or container, its user); exits with its code."""
        raise typer.Exit(_session(run, worker, list(command), tty))

    @app.command("shell")
    @guard()
    def shell(run: str = typer.Argument(..., help="the run"),
              worker: int = typer.Option(0, "--worker", "-w", help="the worker's index in the run")):
        """An interactive shell inside a running worker, on a terminal; exits with the shell's code."""
        raise typer.Exit(_session(run, worker, [], True))

    @app.command("port-forward")
    @guard()
    def port_forward(run: str = typer.Argument(..., help="the run"),
                     ports: str = typer.Argument(..., help="LOCAL[:REMOTE]: listen on LOCAL here, reach REMOTE "
                                                           "inside the worker (the same port when left out)"),
                     worker: int = typer.Option(0, "--worker", "-w", help="the worker's index in the run"),
                     address: str = typer.Option("127.0.0.1", "--address", help="the local address to listen on")):
        """Reach a TCP port inside a running worker from this machine (a notebook, TensorBoard)."""
        local_s, _, remote_s = ports.partition(":")
        try:
            local, remote = int(local_s), int(remote_s or local_s)
        except ValueError:
            raise ApiError(f"ports {ports!r}: give LOCAL or LOCAL:REMOTE, e.g. 8888 or 8888:8888") from None
        srv = socket.create_server((address, local), reuse_port=False)
        print(f"Forwarding from {address}:{srv.getsockname()[1]} -> {run} worker {worker} port {remote}",
              flush=True)
        try:
            while True:
                conn, _ = srv.accept()
                threading.Thread(target=_forward_one, args=(conn, run, worker, remote), daemon=True).start()
        finally:
            srv.close()
