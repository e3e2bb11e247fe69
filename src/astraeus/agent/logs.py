"""The agent's log shipper: reads new lines from the workers' log files (through the runtime), gives each attempt its
fair share of a batch (LOG_BATCH), drops lines over the rate limit (one line says how many), and ships them (POST
/logs, or in the report of an attempt's end) through the agent's client. Where each attempt's log was shipped to
(its offset) is kept in the state dir, so a restarted agent sends nothing twice and nothing is lost.

One thread ships at a time (`lock`: the log thread and the report thread); the offsets and rate limits are under
`state_lock`, which no HTTP call holds, so the reconcile thread can forget an attempt without waiting on a POST."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import httpx

from astraeus import protocol as P

log = logging.getLogger("astraeus.agent")

LOG_BATCH = 2000
LOG_EVERY = 0.5  # a running worker's new lines are shipped within this many seconds (sooner when a batch is full)
LOG_POST_BYTES = 1 << 20  # one POST /logs carries at most about this much text

Key = tuple[str, int]


class LogBatch(NamedTuple):
    """What LogShipper.collect read: the lines, the log offsets and rate limits they move to once stored (by log
    key), whether more are waiting, and the attempts that were quiet (all their new lines fitted their share)."""

    lines: list[P.WorkerLogLine]
    offsets: dict[str, int]
    limits: dict[str, list]
    more: bool
    quiet: set[tuple[str, int]]


class LogsDeferred(httpx.HTTPStatusError):
    """The control plane refused a batch of log lines for now (429: too many being stored): none of it was stored,
    the lines stay unshipped (their offsets did not move), and they go again after `retry_after` seconds."""

    def __init__(self, response: httpx.Response):
        try:
            self.retry_after = min(60.0, max(0.1, float(response.headers.get("retry-after", "1"))))
        except ValueError:
            self.retry_after = 1.0
        super().__init__(f"log lines deferred by the control plane for {self.retry_after:g} s",
                         request=response.request, response=response)


def log_key(key: Key) -> str:
    return f"{key[0]}.{key[1]}"


class LogShipper:
    """`post(http, path, body)` sends one request (the agent's client); `reported(key)` says whether an attempt's
    end was reported; `wake_report` is set when an ended attempt's lines are left to its report."""

    def __init__(self, runtime, machine: str, state_dir: str, log_rate: int,
                 post: Callable[..., dict], reported: Callable[[Key], bool], wake_report: threading.Event):
        self.runtime = runtime
        self.machine = machine
        self.post = post
        self.reported = reported
        self.wake_report = wake_report
        self.log_rate = log_rate  # per worker: the rest are dropped
        self.lock = threading.Lock()  # one shipping at a time: the log and report threads both ship lines
        self.state_lock = threading.Lock()  # offsets, limits
        self.offsets_path = os.path.join(state_dir, "log-offsets.json")
        self.offsets: dict[str, int] = self._load_offsets()
        self.limits: dict[str, list] = {}  # attempt's log key -> [second, shipped in it, dropped, seq, time]
        self.lines_in_report = True  # an ended attempt's last lines go in its report (False: an older control plane)
        # The control plane refused a batch (429) until this time (monotonic): meanwhile only the attempts that were
        # quiet in the last round (all their new lines fitted their share) ship, each LOG_EVERY, in small batches
        # it admits while busy storing floods (routers/agent.py: the small lane)
        self.deferred_until = 0.0
        self.quiet_attempts: set[Key] = set()

    def _load_offsets(self) -> dict[str, int]:
        try:
            with open(self.offsets_path) as f:
                return {str(k): int(v) for k, v in json.load(f).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _save_offsets(self) -> None:
        tmp = self.offsets_path + ".tmp"
        with self.state_lock:
            text = json.dumps(self.offsets)
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.offsets_path)

    def defer(self, seconds: float) -> None:
        """A batch was refused (LogsDeferred): only the quiet attempts ship for `seconds`."""
        self.deferred_until = time.monotonic() + seconds

    def all_shipped(self, key: Key) -> bool:
        """Whether every line attempt `key` wrote so far was shipped."""
        with self.state_lock:
            start = self.offsets.get(log_key(key), 0)
        pending, _ = self.runtime.read_logs(key[0], key[1], start, limit=1)
        return not pending

    def forget(self, key: Key) -> None:
        """Drop a forgotten attempt's offset and rate limit."""
        with self.state_lock:
            self.offsets.pop(log_key(key), None)
            self.limits.pop(log_key(key), None)

    def ship(self, http: httpx.Client, only: set[Key] | None = None) -> bool:
        """Send one batch of new lines from every attempt (or those in `only`); True when more are waiting."""
        with self.lock:
            return self._ship(http, only)

    def _ship(self, http: httpx.Client, only: set[Key] | None) -> bool:
        if only is None and time.monotonic() < self.deferred_until:
            if not self.quiet_attempts:
                return False
            # a batch was refused: the quiet ones alone, those still quiet (one that floods now waits with the rest)
            batch = self.collect(set(self.quiet_attempts))
            self.quiet_attempts = batch.quiet
            self._post_logs(http, batch, quiet_only=True)
            return False  # the rest waits for the refusal's Retry-After
        batch = self.collect(only)
        if only is None:
            self.quiet_attempts = batch.quiet
        self._post_logs(http, batch)
        return batch.more

    def ship_with_report(self, http: httpx.Client, ended: set[Key], report: Callable[[list | None], None],
                         bare_report: Callable[[], None]) -> None:
        """Send a report (`report(lines)`) with the last lines of the attempts in `ended` (they ended since the
        last report): in the report itself when they fit one request, else shipped before it. A control plane
        that takes no lines in a report (older than the field: 422) gets them shipped first, then
        `bare_report()`, and from now on."""
        with self.lock:
            tail = None  # the ended attempts' last lines, and the offsets they move to once stored
            for _ in range(10):
                if not ended:
                    break
                tail = self.collect(ended)
                lines, more = tail.lines, tail.more
                if not more and (not lines or self.lines_in_report and
                                 sum(len(ln.text) + 100 for ln in lines) < LOG_POST_BYTES):
                    break
                self._post_logs(http, tail)  # too many for one request: ahead of the report, as they come
                tail = None
                if not more:
                    break
            lines = tail.lines if tail is not None and tail.lines else None
            try:
                report(lines)
            except httpx.HTTPStatusError as e:
                if lines is None or e.response.status_code != 422 or "lines" not in e.response.text:
                    raise
                self.lines_in_report = False  # an older control plane: ship them first, from now on
                log.info("the control plane takes no log lines in a report; shipping them before it")
                self._post_logs(http, tail)
                bare_report()
            else:
                if tail is not None:
                    self._stored(tail)

    def collect(self, only: set[Key] | None) -> LogBatch:
        """One batch of new lines from every attempt (or those in `only`): the lines, the log offsets and rate
        limits once they are stored, whether more are waiting, and the attempts that were quiet (all their new
        lines fitted their share). Without `only`, an attempt that ended and is not reported yet is left to the
        report, which carries its last lines (ship_with_report). Each attempt first gets its share of the batch
        (LOG_BATCH / attempts), then those with more take what is left, in turn: a quiet worker's lines never
        wait behind a flooding neighbour's backlog."""
        lines: list[P.WorkerLogLine] = []
        new_offsets: dict[str, int] = {}
        new_limits: dict[str, list] = {}
        read = 0
        attempts = []
        for st in self.runtime.list():
            if only is not None and st.key not in only:
                continue
            if only is None and st.final and not self.reported(st.key) and self.lines_in_report:
                self.wake_report.set()
                continue
            attempts.append(st)
        with self.state_lock:
            offsets, limits = dict(self.offsets), dict(self.limits)

        def take(st, want: int) -> bool:
            """Up to `want` lines of one attempt; True when it has more."""
            nonlocal lines, read
            lk = log_key(st.key)
            start = new_offsets.get(lk, offsets.get(lk, 0))
            batch, end = self.runtime.read_logs(st.worker, st.attempt, start, limit=want)
            limit = new_limits.get(lk) or limits.get(lk, [0, 0, 0, 0, 0.0])
            if batch or end != start or limit[2]:
                read += len(batch)
                new_limits[lk] = list(limit)
                lines += self._rate_limited(st.worker, st.attempt, batch, new_limits[lk], at_end=len(batch) < want)
                new_offsets[lk] = end
            return len(batch) >= want

        share = max(1, LOG_BATCH // max(1, len(attempts)))
        behind = [st for st in attempts if take(st, share)]
        more = False
        for st in behind:
            if read >= LOG_BATCH:
                more = True
                break
            more = take(st, LOG_BATCH - read) or more
        late = {st.key for st in behind}
        return LogBatch(lines, new_offsets, new_limits, more, {st.key for st in attempts if st.key not in late})

    def _post_logs(self, http: httpx.Client, batch: LogBatch, quiet_only: bool = False) -> None:
        """POST /logs a batch of collect, then note its offsets. The quiet attempts' lines go first, in posts of
        their own (small ones, which the control plane admits while it is busy storing a flood: a worker that
        prints a little is not held up by a neighbour that floods), their offsets noted once stored. With
        `quiet_only` (while deferred), only those: the others' offsets stay, their lines are read again later."""
        quiet = {log_key(k) for k in batch.quiet}
        first = [ln for ln in batch.lines if log_key((ln.worker, ln.attempt)) in quiet]
        rest = batch.lines
        if quiet_only or (first and len(first) < len(batch.lines)):
            if first:
                self._post_parts(http, first)
            self._stored(batch, quiet)
            if quiet_only:
                return
            rest = [ln for ln in batch.lines if log_key((ln.worker, ln.attempt)) not in quiet]
        self._post_parts(http, rest)
        self._stored(batch)

    def _post_parts(self, http: httpx.Client, lines: list[P.WorkerLogLine]) -> None:
        part: list[P.WorkerLogLine] = []
        size = 0
        for ln in lines:  # bounded posts: a flood of long lines is several, each about LOG_POST_BYTES
            part.append(ln)
            size += len(ln.text) + 100
            if size >= LOG_POST_BYTES:
                self._post_part(http, part)
                part, size = [], 0
        if part:
            self._post_part(http, part)

    def _post_part(self, http: httpx.Client, part: list[P.WorkerLogLine]) -> None:
        """POST /logs one part of a batch; a 429 raises LogsDeferred. A part stored before a later one was refused
        is sent again with the rest: the control plane stores a line once (worker, attempt, seq)."""
        try:
            self.post(http, "/logs", P.Logs(machine=self.machine, lines=part))
        except httpx.HTTPStatusError as e:
            if e.response.status_code == 429:
                raise LogsDeferred(e.response) from None
            raise

    def _stored(self, batch: LogBatch, keys: set[str] | None = None) -> None:
        """Note the offsets (and rate limits) a stored batch moves to: all of them, or those of the log keys in
        `keys`."""
        offsets = batch.offsets if keys is None else {k: v for k, v in batch.offsets.items() if k in keys}
        if offsets:
            with self.state_lock:
                self.offsets.update(offsets)
                self.limits.update(batch.limits if keys is None else
                                   {k: v for k, v in batch.limits.items() if k in keys})
            self._save_offsets()

    def _rate_limited(self, worker: str, attempt: int, batch, state: list, at_end: bool) -> list[P.WorkerLogLine]:
        """The lines of one attempt's batch to ship: at most log_rate per second of the lines' own times. The
        rest are dropped, and one line says how many, at the next second's first line or at the end of what
        the worker has written so far (so a flood adds at most one such line a second)."""

        def dropped() -> P.WorkerLogLine:
            n, state[2] = state[2], 0
            return P.WorkerLogLine(worker=worker, attempt=attempt, seq=state[3], time=state[4],
                                   stream="stderr", text=f"… {n} lines dropped (over {self.log_rate} lines/s)")

        out = []
        for ln in batch:
            second = int(ln.time)
            if second != state[0]:
                state[0], state[1] = second, 0
            if state[1] < self.log_rate:
                if state[2]:
                    out.append(dropped())
                state[1] += 1
                out.append(ln.shipped())
            else:
                state[2], state[3], state[4] = state[2] + 1, ln.seq, ln.time  # the marker takes a dropped seq
        if state[2] and at_end:
            out.append(dropped())
        return out
