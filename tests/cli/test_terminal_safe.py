"""Terminal injection (issue 42, item 8): whatever the CLI prints that the user did not type — log lines, args,
labels, reasons, events — cannot drive the reader's terminal. On a terminal control characters are shown escaped
(`\\x1b`), as kubectl and git do; `logs --raw`, and logs to a pipe or a file, keep the bytes; `-o json` stays
exact JSON.

The pure function first (a table of cases), then the tables and `describe` built from hostile API objects, then
`astra` as a subprocess against a real local cluster, on a pseudo-terminal (pty) and on a pipe."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from astraeus.cli import format as fmt
from astraeus.cli.format import terminal_safe

ASTRA = str(Path(sys.executable).parent / "astra")
IMAGE = "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime"

TITLE = "\x1b]0;pwned\x07"  # OSC 0: set the window title
CLEAR = "\x1b[2J"  # CSI: clear the screen
LINK = "\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\"  # OSC 8: a hyperlink whose text hides its target
EVIL = TITLE + CLEAR + LINK
# how they are shown
LINK_SHOWN = r"\x1b]8;;http://evil.example/\x1b\click me\x1b]8;;\x1b" + "\\"
EVIL_SHOWN = r"\x1b]0;pwned\x07\x1b[2J" + LINK_SHOWN

# --- the pure function ------------------------------------------------------------------------------------------

CASES = [
    # (text, shown in a table cell or message, shown in log output)
    ("plain text", "plain text", "plain text"),
    ("", "", ""),
    (None, "", ""),
    (42, "42", "42"),
    ("héllo wörld 日本語 🚀", "héllo wörld 日本語 🚀", "héllo wörld 日本語 🚀"),
    ("[bold red]not markup[/]", "[bold red]not markup[/]", "[bold red]not markup[/]"),
    (r"C:\path\x1b stays", r"C:\path\x1b stays", r"C:\path\x1b stays"),  # backslashes are kept as they are
    (TITLE, r"\x1b]0;pwned\x07", r"\x1b]0;pwned\x07"),
    (CLEAR, r"\x1b[2J", r"\x1b[2J"),
    (LINK, LINK_SHOWN, LINK_SHOWN),
    ("\x1b[31mred\x1b[0m", r"\x1b[31mred\x1b[0m", r"\x1b[31mred\x1b[0m"),
    ("ding\x07", r"ding\x07", r"ding\x07"),
    ("safe\rEVIL", r"safe\rEVIL", r"safe\rEVIL"),  # a carriage return would overwrite the line's start
    ("abc\x08\x08\x08xyz", r"abc\x08\x08\x08xyz", r"abc\x08\x08\x08xyz"),  # backspaces likewise
    ("a\tb", r"a\tb", "a\tb"),  # tab: escaped in a cell, kept in a log
    ("one\ntwo\n", r"one\ntwo\n", "one\ntwo\n"),  # newline: escaped in a cell (no forged row), kept in a log
    ("crlf\r\n", r"crlf\r\n", "crlf\\r\n"),
    ("\x00nul", r"\x00nul", r"\x00nul"),
    ("\x0b\x0c", r"\x0b\x0c", r"\x0b\x0c"),
    ("del\x7f", r"del\x7f", r"del\x7f"),
    ("\x9b31mC1 CSI", r"\x9b31mC1 CSI", r"\x9b31mC1 CSI"),  # C1 controls U+0080-U+009F
    ("\x80\x85\x9f", r"\x80\x85\x9f", r"\x80\x85\x9f"),
    ("\xa0nbsp", "\xa0nbsp", "\xa0nbsp"),  # just past C1: printable
    ("user\u202egnp.exe", r"user\u202egnp.exe", r"user\u202egnp.exe"),  # right-to-left override
    ("\u202a\u202b\u202c\u202d", r"\u202a\u202b\u202c\u202d", r"\u202a\u202b\u202c\u202d"),
    ("\u2066\u2067\u2068\u2069", r"\u2066\u2067\u2068\u2069", r"\u2066\u2067\u2068\u2069"),
    ("\u200e\u200f\u061c", r"\u200e\u200f\u061c", r"\u200e\u200f\u061c"),  # bidi marks
    ("lone \ud800 surrogate", r"lone \ud800 surrogate", r"lone \ud800 surrogate"),  # a JSON string may hold one
]


@pytest.mark.parametrize(("text", "cell", "log"), CASES)
def test_terminal_safe_cases(text, cell, log):
    assert terminal_safe(text) == cell
    assert terminal_safe(text, lines=True) == log


def test_terminal_safe_leaves_nothing_a_terminal_acts_on():
    everything = "".join(chr(i) for i in range(0x200)) + "".join(chr(i) for i in range(0x2000, 0x2070)) + "\u061c"
    for out, kept in ((terminal_safe(everything), ""), (terminal_safe(everything, lines=True), "\t\n")):
        bad = [c for c in out if (ord(c) < 0x20 and c not in kept) or 0x7f <= ord(c) <= 0x9f
               or c in "\u061c\u200e\u200f" or 0x202a <= ord(c) <= 0x202e or 0x2066 <= ord(c) <= 0x2069]
        assert bad == []
        out.encode("utf-8")  # writable: nothing a terminal encoding refuses


def test_terminal_safe_is_idempotent():
    for text, _, _ in CASES:
        once = terminal_safe(text)
        assert terminal_safe(once) == once
        assert terminal_safe(terminal_safe(text, lines=True), lines=True) == terminal_safe(text, lines=True)


# --- tables and describe from hostile API objects --------------------------------------------------------------


def hostile_run() -> dict:
    return {
        "metadata": {"name": "pwn", "workspace": "vision", "cluster": "main",
                     "labels": {"team": "ml" + TITLE, "x\u202e": "y\nInjected: yes"}},
        "spec": {"priority": 0, "task_template": {
            "image": "img" + CLEAR, "command": "python", "args": ["-c", "print(1)", EVIL],
            "env": {"A": {"value": "v\x1b[8m"}},
            "datavolume_refs": [{"name": "d", "mount_path": "/m\x07", "mode": "ReadWrite"}],
            "requested_resources": {}}},
        "status": {"state": "Pending", "reason": "Failed (cannot start the command: " + EVIL + ")",
                   "console_url": "http://x/\x1b]8;;http://evil/\x1b\\",
                   "workers": [{"name": "pwn-0", "state": "Pending", "restarts": 0, "preemptions": 0,
                                "machine": "gpu-01\r", "gpu_indices": [], "reason": "waits\x1b[2K",
                                "why_not": [{"machine": "gpu-02\x1b[1A", "reason": "lost\nFake line"}]}],
                   "history": [{"time": "2026-11-29T09:00:00Z", "state": "Pending", "reason": "Submitted\tby " + TITLE}]},
    }


def no_controls(text: str) -> None:
    """Only newlines that the CLI itself writes; no other control character, C1 control or bidi control."""
    bad = sorted({repr(c) for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f
                  or 0x202a <= ord(c) <= 0x202e or 0x2066 <= ord(c) <= 0x2069})
    assert bad == [], text


def test_describe_escapes_labels_args_reasons_and_everything_else():
    out = fmt.describe_run(hostile_run())
    no_controls(out)
    assert r"Labels:         team=ml\x1b]0;pwned\x07, x\u202e=y\nInjected: yes" + "\n" in out
    assert "\nInjected: yes" not in out  # no line forged by a label value
    assert f"Command:        python -c 'print(1)' '{EVIL_SHOWN}'\n" in out
    assert r"Reason:         Failed (cannot start the command: \x1b]0;pwned\x07" in out
    assert r"Image:          img\x1b[2J" + "\n" in out
    assert r"Env:            A=v\x1b[8m" + "\n" in out
    assert r"Drives:         d at /m\x07 (ReadWrite)" + "\n" in out
    assert r"  gpu-02\x1b[1A: lost\nFake line" + "\n" in out
    assert r"  2026-11-29 09:00:00 UTC  Pending  Submitted\tby \x1b]0;pwned\x07" + "\n" in out
    # the workers table stays aligned: the escaped machine is as wide as it is shown
    workers = out.split("Workers:\n")[1].split("\n\n")[0].splitlines()
    assert workers[1][workers[0].index("GPUS")] == "-"
    assert workers[1][workers[0].index("REASON"):] == r"waits\x1b[2K"


def test_tables_escape_every_cell_and_stay_aligned():
    runs = [hostile_run(), {"metadata": {"name": "ok", "cluster": "main"}, "status": {"state": "Running",
                                                                                      "reason": "fine"}}]
    out = fmt.runs_table(runs)
    no_controls(out)
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[1] == f"pwn                           main          Pending     Failed (cannot start the command: " \
                       f"{EVIL_SHOWN})"

    events = fmt.events_table([{"time": "2026-11-29T09:00:00Z", "kind": "RunFailed", "object": "pwn\u202e",
                                "message": "a\nb\rc" + TITLE}, {"time": None, "kind": "K", "object": "o",
                                                                 "message": "m"}])
    no_controls(events)
    rows = events.splitlines()
    assert len(rows) == 3
    assert rows[1] == r"2026-11-29 09:00:00 UTC  RunFailed  pwn\u202e  a\nb\rc\x1b]0;pwned\x07"
    assert rows[2].index("m") == rows[1].index("a\\n")  # widths from the escaped cells

    for table in (fmt.machines_table([{"name": "gpu-01", "state": "Lost\x1b[2J", "runtime": "process\x07",
                                       "address": "10.0.0.1\r", "shared_filesystems": {"lab\x1b": "/x"}}]),
                  fmt.drives_table([{"metadata": {"name": "d"}, "spec": {"sources": [
                      {"node": "gpu-01", "path": "/data\x1b]0;t\x07", "mount_path": "/ckpt\n"}]},
                      "status": {"state": "Failed\x9b"}}]),
                  fmt.templates_table([{"metadata": {"name": "t"}, "spec": {"task_template": {"image": EVIL}}}]),
                  fmt.schedules_table([{"metadata": {"name": "s"}, "spec": {"schedule": "* * * * *",
                                                                            "timezone": "UTC\u202e"},
                                        "status": {"active": ["r\x1b"]}}]),
                  fmt.replica_groups_table([{"metadata": {"name": "g"}, "spec": {"run": {"template": "t\x07"}},
                                             "status": {"retry_at": "\x1b[2J"}}]),
                  fmt.registries_table([{"registry": "r\x1b", "username": "u\x07"}]),
                  fmt.pools_table([{"name": "p", "machines": ["m\x1b"]}]),
                  fmt.reservations_table([{"name": "r", "machines": ["m\r"], "state": "Active\x07"}])):
        no_controls(table)
        assert len(table.splitlines()) == 2
        assert "\\x1b" in table or "\\x07" in table or "\\r" in table or "\\u202e" in table or "\\x9b" in table


def test_squeue_what_if_and_test_only_escape_reasons():
    now = fmt.parse_time("2026-11-29T10:00:00Z")
    sq = fmt.squeue_table([{"metadata": {"name": "pwn", "cluster": "main", "workspace": "vision"},
                            "status": {"state": "Pending", "reason": "Waiting " + EVIL}}], now)
    no_controls(sq)
    assert sq.splitlines()[1].endswith(f" (Waiting {EVIL_SHOWN})")

    answer = {"outcome": "Queued", "message": "Waits " + TITLE, "reason": "Behind\nx",
              "placements": [{"worker": "w\x07", "machine": "m\r", "gpu_indices": [0]}], "preempts": ["a\x1b"],
              "why_not": {"w-0": [{"machine": "gpu-01\x1b[2K", "reason": "full\u202e"}]}}
    out = fmt.what_if(answer)
    no_controls(out)
    assert out.splitlines() == [r"Waits \x1b]0;pwned\x07", r"Reason: Behind\nx", r"  w\x07 on m\r (GPUs 0)",
                                r"Would preempt: a\x1b", "Why not:", r"  w-0 gpu-01\x1b[2K: full\u202e"]

    line, starts = fmt.sbatch_test_only({"outcome": "Refused", "reason": "no " + TITLE}, "job", 1, None)
    assert (line, starts) == (r"sbatch: Job job would not start: no \x1b]0;pwned\x07", False)
    line, starts = fmt.sbatch_test_only({"outcome": "Starts", "placements": [{"machine": "gpu\x1b"}]}, "job", 1, "p")
    assert starts and r"on nodes gpu\x1b in partition p" in line
    no_controls(line)


# --- astra against a real cluster, on a terminal and on a pipe ---------------------------------------------------

# The worker writes its first argument, escapes and all, as one log line (bytes, whatever its locale), then a line
# with a tab, a carriage-return trick, a C1 CSI and a right-to-left override.
TRICKS = "col1\tcol2 safe\rEVIL \x9b31mc1 \u202eevil\u202c"
CODE = ("import os,sys;sys.stdout.buffer.write(os.fsencode(sys.argv[1])+b'\\n'+os.fsencode(sys.argv[2])+b'\\n');"
        "sys.stdout.flush()")
LOG = f"{EVIL}\n{TRICKS}\n"
SHOWN = EVIL_SHOWN + "\n" + "col1\tcol2 safe\\rEVIL \\x9b31mc1 \\u202eevil\\u202c\n"
BAD_COMMAND = "[bold]" + TITLE + "nope"  # no such command: the reason quotes it


def astra(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ASTRA, *args], env=cluster.env, capture_output=True, timeout=60)


def on_terminal(cluster, *args: str, seconds: float | None = None, columns: int = 400) -> tuple[int, bytes, bytes]:
    """`astra ARGS` with stdout and stderr on a pseudo-terminal (its own, `columns` wide; no newline translation),
    stdin from /dev/null: (exit status, what the terminal got on stdout, on stderr). `seconds`: interrupt it (Ctrl-C)
    after that long (for --watch)."""
    out_master, out_slave = pty.openpty()
    err_master, err_slave = pty.openpty()
    for fd in (out_slave, err_slave):
        attrs = termios.tcgetattr(fd)
        attrs[1] &= ~termios.OPOST  # the bytes as written: no \n → \r\n
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in cluster.env.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    env["TERM"] = "xterm-256color"
    # Ctrl-C as a terminal sends it: SIGINT at its default in astra, even where make test was started in the
    # background of a shell (which starts its background jobs with SIGINT ignored, and children inherit that)
    p = subprocess.Popen([ASTRA, *args], env=env, stdin=subprocess.DEVNULL, stdout=out_slave, stderr=err_slave,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(out_slave)
    os.close(err_slave)
    got = {out_master: bytearray(), err_master: bytearray()}
    open_fds = set(got)
    start = time.monotonic()
    interrupted = False
    try:
        while open_fds:
            if seconds is not None and not interrupted and time.monotonic() - start > seconds:
                p.send_signal(signal.SIGINT)
                interrupted = True
            assert time.monotonic() - start < 90, f"astra {args} did not end: {bytes(got[out_master])!r}"
            ready, _, _ = select.select(list(open_fds), [], [], 0.2)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the other side is closed
                    data = b""
                if data:
                    got[fd] += data
                else:
                    open_fds.discard(fd)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(out_master)
        os.close(err_master)
    return rc, bytes(got[out_master]), bytes(got[err_master])


def no_escape_sequence(data: bytes) -> None:
    """What a terminal got holds no ESC, BEL, CR, backspace, C1 control (as UTF-8) nor bidi control."""
    text = data.decode("utf-8")
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\x08" not in text, text
    no_controls(text.replace("\t", " "))


@pytest.fixture(scope="module")
def pwn(shared_cluster):
    """A run whose args and log carry escape sequences, and one whose command (quoted in its reason) does."""
    c = shared_cluster
    r = astra(c, "astraeus", "run", "--name", "pwn", "--image", IMAGE, "--", "python", "-c", CODE, EVIL, TRICKS)
    assert r.returncode == 0, r.stderr
    r = astra(c, "astraeus", "run", "--name", "pwn-cmd", "--image", IMAGE, "--", BAD_COMMAND, "arg" + CLEAR)
    assert r.returncode == 0, r.stderr
    c.wait_for(lambda: c.run("pwn")["status"]["state"] == "Completed" and c.run("pwn-cmd")["status"]["state"] ==
               "Failed", timeout=90, interval=0.3, what="pwn completed and pwn-cmd failed")
    assert c.logs("pwn-0") == LOG  # what the API holds: the worker's bytes, as written
    assert TITLE in c.run("pwn-cmd")["status"]["reason"]
    yield c
    with c.client() as h:
        for name in ("pwn", "pwn-cmd"):
            h.delete(f"/runs/{name}")


def test_logs_on_a_terminal_show_escapes_as_text(pwn):
    for args in (["pwn-0"], ["pwn-0", "-f"], ["pwn", "--tail", "2"]):
        rc, out, err = on_terminal(pwn, "astraeus", "logs", *args)
        assert (rc, err) == (0, b""), (args, err)
        assert out.decode() == SHOWN, args  # the literal text \x1b]0;pwned\x07, a tab and newlines as they are
        assert rb"\x1b]0;pwned\x07" in out
        no_escape_sequence(out)
    rc, out, _ = on_terminal(pwn, "astraeus", "logs", "pwn-0", "--timestamps")
    assert rc == 0 and out.count(b"\n") == 2 and rb" \x1b]0;pwned\x07\x1b[2J" in out
    no_escape_sequence(out)


def test_logs_raw_and_logs_to_a_pipe_keep_the_bytes(pwn, tmp_path):
    exact = LOG.encode()
    for args in (["pwn-0", "--raw"], ["pwn-0", "--raw", "-f"]):
        rc, out, err = on_terminal(pwn, "astraeus", "logs", *args)
        assert (rc, out, err) == (0, exact, b""), args
    for args in (["pwn-0"], ["pwn-0", "-f"], ["pwn-0", "--raw"]):
        r = astra(pwn, "astraeus", "logs", *args)  # stdout a pipe
        assert (r.returncode, r.stdout) == (0, exact), args
    with open(tmp_path / "pwn.log", "wb") as f:  # astra astraeus logs pwn-0 > pwn.log
        subprocess.run([ASTRA, "astraeus", "logs", "pwn-0"], env=pwn.env, stdout=f, check=True, timeout=60)
    assert (tmp_path / "pwn.log").read_bytes() == exact


def test_describe_runs_and_events_escape_args_and_reasons(pwn):
    rc, out, err = on_terminal(pwn, "astraeus", "describe", "pwn")
    assert (rc, err) == (0, b"")
    no_escape_sequence(out)
    text = out.decode()
    assert "Command:        python -c " in text, text
    assert f" '{EVIL_SHOWN}' " + r"'col1\tcol2 safe\rEVIL \x9b31mc1 \u202eevil\u202c'" + "\n" in text, text
    # to a pipe, describe escapes alike
    r = astra(pwn, "astraeus", "describe", "pwn-cmd")
    assert r.returncode == 0
    no_escape_sequence(r.stdout)
    assert rb"Reason:         Failed (failed to start: cannot start the command: [bold]\x1b]0;pwned\x07nope" in r.stdout
    assert rb"Command:        '[bold]\x1b]0;pwned\x07nope' 'arg\x1b[2J'" + b"\n" in r.stdout

    rc, out, err = on_terminal(pwn, "astraeus", "runs")
    assert (rc, err) == (0, b"")
    no_escape_sequence(out)
    line = next(x for x in out.decode().splitlines() if x.startswith("pwn-cmd "))
    assert line.startswith(r"pwn-cmd                       main          Failed      Failed (failed to start: cannot "
                           r"start the command: [bold]\x1b]0;pwned\x07nope"), line

    rc, out, _ = on_terminal(pwn, "astraeus", "events")
    assert rc == 0
    no_escape_sequence(out)
    assert rb"RunFailed" in out and rb"[bold]\x1b]0;pwned\x07nope" in out

    # -o json stays exact JSON: the reason as the server holds it
    data = json.loads(astra(pwn, "astraeus", "runs", "-o", "json").stdout)
    reasons = {x["metadata"]["name"]: x["status"]["reason"] for x in data["items"]}
    assert TITLE in reasons["pwn-cmd"]
    rc, out, _ = on_terminal(pwn, "astraeus", "runs", "-o", "json")
    assert rc == 0 and b"\x1b" not in out and json.loads(out)["items"] == data["items"]


def test_runs_watch_on_a_terminal_shows_no_markup_and_no_escapes(pwn):
    rc, out, _ = on_terminal(pwn, "astraeus", "runs", "--watch", "--interval", "0.3", seconds=3)
    assert rc == 0
    text = out.decode()
    assert r"[bold]\x1b]0;pwned\x07nope" in text, text  # rich neither took [bold] as markup nor saw an escape
    assert TITLE not in text and CLEAR not in text and "]0;pwned" not in text.replace(r"\x1b]0;pwned", "")


def test_errors_on_a_terminal_are_escaped(pwn):
    rc, out, err = on_terminal(pwn, "astraeus", "describe", "no" + TITLE)
    assert rc == 1 and out == b""
    no_escape_sequence(err)
    assert err.count(b"\n") == 1 and rb"\x1b]0;pwned\x07" in err, err
