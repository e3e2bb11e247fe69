"""The agent's client of the control plane: which replica it talks to (failover), which scheduling leader's answers
it takes (epochs), this machine's credential (kept in the state dir, renewed by joining again), and the HTTP calls of
the agent API (register, assignments, report, logs). The agent's threads share one ControlPlaneClient; what they
share in it is under `server_lock`. See astraeus.agent.agent's docstring for the protocol."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx

from astraeus import protocol as P

log = logging.getLogger("astraeus.agent")

# An older leader epoch than one seen is ignored; answered only that for this long, the agent takes it (the
# control plane's database went back: restored from a backup, or a standby that lagged promoted).
EPOCH_BACK_AFTER = 60.0


class NeedsRegister(Exception):
    pass


class Backoff:
    def __init__(self, first: float = 0.2, cap: float = 10.0):
        self.first, self.cap, self.n = first, cap, 0

    def reset(self) -> None:
        self.n = 0

    def next(self) -> float:
        d = min(self.cap, self.first * (2 ** self.n))
        self.n = min(self.n + 1, 20)
        return d * (0.75 + random.random() / 2)


class ControlPlaneClient:
    def __init__(self, server: str | list[str], token: str, credential_path: str):
        self.servers = agent_bases(server)  # the control plane's replicas: one is used at a time
        self.server_lock = threading.Lock()  # current, epoch, older_since, failovers, version
        self.current = 0  # index in self.servers of the replica in use
        self.epoch = 0  # the highest scheduling leader epoch seen in an answer
        self.older_since: float | None = None  # since when every answer's epoch has been below self.epoch
        self.epoch_back_after = EPOCH_BACK_AFTER
        self.failovers = 0
        self.version = 0  # the assignments version the next poll asks after (0: the whole desired state)
        self.token = token  # the join token (or this machine's credential, given as is)
        self.credential_path = credential_path
        self.credential: str | None = self.load_credential()
        self.registered = threading.Event()
        self.heartbeat_seconds = 5.0
        self.cluster: str | None = None
        self.disk_in_report = True  # its state dir's filesystem goes in each report (False: an older control plane)

    @property
    def base(self) -> str:
        """The agent API of the replica in use (http://cp-host:8420/api/v1/agent)."""
        return self.servers[self.current]

    def failover(self, e: Exception) -> bool:
        """A request failed with `e`: when it says the replica it went to is not answering (a connection error, a
        timeout, a 5xx) and that replica is still the one in use, move to the next replica; True when moved.
        Nothing else changes: the machine stays registered (every replica shares the database) and its workers
        run on; the next poll asks the new replica for the whole desired state."""
        if len(self.servers) < 2 or not not_answering(e):
            return False
        failed = self._replica_of(e)
        with self.server_lock:
            if failed != self.servers[self.current]:
                return False  # another thread moved already
            self.current = (self.current + 1) % len(self.servers)
            self.failovers += 1
            now = self.servers[self.current]
            self.version = 0
        log.warning("control plane %s not answering (%s); using %s", root_url(failed), why_not(e), root_url(now))
        return True

    def _replica_of(self, e: Exception) -> str:
        try:
            url = str(e.request.url)  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):
            return self.base
        return next((b for b in self.servers if url.startswith(b + "/") or url == b), self.base)

    def take_epoch(self, epoch: int | None) -> bool:
        """Whether to use an answer made under scheduling leader `epoch`: not when a newer epoch was seen (a
        replica that lost the lead, or an answer read before the new leader took it). Records the highest."""
        if epoch is None:
            return True
        with self.server_lock:
            seen = self.epoch
            if epoch < seen:
                now = time.monotonic()
                self.older_since = self.older_since or now
                if now - self.older_since < self.epoch_back_after:
                    log.warning("ignoring assignments from %s made under leader epoch %d: epoch %d was seen already",
                                root_url(self.base), epoch, seen)
                    return False
                # Not a stale replica: the database itself went back (restored, or a lagging standby promoted).
                log.warning("the control plane's leader epoch has been %d, below the %d seen, for %.0f s: taking it "
                            "(was its database restored, or a standby promoted?)", epoch, seen, now - self.older_since)
            self.epoch = epoch
            self.older_since = None
        if seen and epoch > seen:
            log.info("scheduling leader epoch %d (was %d)", epoch, seen)
        return True

    def took(self, version: int) -> None:
        """The desired state of `version` is taken: the next poll asks for what changed after it."""
        with self.server_lock:
            self.version = version

    def http(self, timeout: float = 15.0) -> httpx.Client:
        """An HTTP client for one thread's calls, each carrying the machine's credential."""
        return httpx.Client(auth=self._auth, timeout=timeout)

    def _auth(self, request: httpx.Request) -> httpx.Request:
        """Every call but a join carries the machine's credential (the one current when it is sent)."""
        if "Authorization" not in request.headers:
            request.headers["Authorization"] = f"Bearer {self.credential or self.token}"
        return request

    def load_credential(self) -> str | None:
        try:
            with open(self.credential_path) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def save_credential(self, secret: str | None) -> None:
        if secret is None:
            try:
                os.unlink(self.credential_path)
            except FileNotFoundError:
                pass
        else:
            tmp = self.credential_path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secret + "\n")
            os.replace(tmp, self.credential_path)
        self.credential = secret

    def post(self, http: httpx.Client, path: str, body: P.Body, omit_none: tuple[str, ...] = ()) -> dict:
        """POST `body`; the fields in `omit_none` are left out when None (a control plane older than them takes the
        body without them)."""
        payload = body.model_dump(mode="json")
        for k in omit_none:
            if payload.get(k) is None:
                payload.pop(k, None)
        for w in payload.get("workers") or ():  # a report's newer worker fields, only when set (issue 47)
            for k in P.WORKER_REPORT_OPTIONAL:
                if w.get(k) is None:
                    w.pop(k, None)
        r = http.post(self.base + path, json=payload)
        if r.status_code in (401, 403, 404, 409):
            if path != "/register":
                self.registered.clear()
                raise NeedsRegister(f"{path}: {r.status_code} {r.text[:200]}")
        r.raise_for_status()
        return r.json() if r.content else {}

    def register(self, http: httpx.Client, body: P.Register) -> P.Registered:
        """Register this machine (POST /register) with its credential, or join with the token: a credential the
        control plane does not know is dropped and the machine joins again; a revoked one keeps it out
        (NeedsRegister) until its file is deleted. Registered, the next poll asks for the whole desired state."""
        before = self.credential
        self.credential = self.load_credential()  # deleting the file is how an operator makes it join again
        payload = body.model_dump(mode="json")
        r = http.post(self.base + "/register", json=payload)
        if r.status_code == 422:  # a control plane older than these fields (0005, 0006): they are left out
            newer = ("runtime", "address", "shared_filesystems", "nfs", "disk")
            if any(k in r.text for k in newer):
                for k in newer:
                    payload.pop(k, None)
                self.disk_in_report = False  # nor in its reports (agent/disk.py)
                r = http.post(self.base + "/register", json=payload)
        if self.credential and r.status_code in (401, 403):
            if _code(r) == "CREDENTIAL_REVOKED":
                log.error("this machine's credential was revoked (%s); delete %s to join again", _message(r),
                          self.credential_path)
                raise NeedsRegister(f"/register: {r.status_code} {_message(r)}")
            log.warning("the control plane does not take this machine's credential (%s); joining again with the "
                        "join token", _message(r))
            self.save_credential(None)
            r = http.post(self.base + "/register", json=payload)
        if r.status_code in (401, 403, 409):
            log.error("registering %s refused: %s %s", body.name, r.status_code, _message(r))
            raise NeedsRegister(f"/register: {r.status_code} {_message(r)}")
        r.raise_for_status()
        ans = P.Registered.model_validate(r.json())
        if ans.credential:
            self.save_credential(ans.credential)
        self.heartbeat_seconds = ans.heartbeat_seconds
        self.cluster = ans.cluster
        with self.server_lock:
            self.version = 0  # ask for the whole desired state at once
            if self.credential != before:  # joined afresh (a new database?): its epochs start anew
                self.epoch = 0
        return ans

    def assignments(self, http: httpx.Client, machine: str, wait: float) -> P.Assignments | None:
        """Long-poll GET /assignments for what changed after the version taken; None for an answer made under an
        older scheduling leader (take_epoch)."""
        with self.server_lock:
            after = self.version
        r = http.get(self.base + "/assignments", params={"machine": machine, "after": after, "wait": wait})
        if r.status_code in (401, 403, 404, 409):
            self.registered.clear()
            raise NeedsRegister(f"/assignments: {r.status_code}")
        r.raise_for_status()
        data = P.Assignments.model_validate(r.json())
        return data if self.take_epoch(data.epoch) else None


def route_address(url: str) -> str | None:
    """The source address of this machine's route to the control plane at `url`: the address the control plane and
    the other machines reach it at, when no --address says otherwise. No packet is sent (a UDP connect only picks
    the route). None when the name does not resolve or there is no route."""
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect(sockaddr)
                return sock.getsockname()[0]
        except OSError:
            continue
    return None


def agent_bases(server: str | list[str]) -> list[str]:
    """The agent API base of each control plane replica in `server`: one URL or several, comma-separated (or a
    list); a URL that already ends in /api/v1/agent is kept as is. ValueError when none is given."""
    urls = server.split(",") if isinstance(server, str) else list(server)
    out: list[str] = []
    for url in urls:
        url = url.strip().rstrip("/")
        if not url:
            continue
        base = url if url.endswith("/api/v1/agent") else url + "/api/v1/agent"
        if base not in out:
            out.append(base)
    if not out:
        raise ValueError("no control plane URL given")
    return out


def root_url(base: str) -> str:
    """http://cp-host:8420 of an agent API base."""
    return base[: -len("/api/v1/agent")] if base.endswith("/api/v1/agent") else base


def not_answering(e: Exception) -> bool:
    """Whether a failed request says its replica is not answering: a connection error or timeout, or a 5xx."""
    if isinstance(e, httpx.HTTPStatusError):
        return e.response.status_code >= 500
    return isinstance(e, httpx.TransportError)


def why_not(e: Exception) -> str:
    if isinstance(e, httpx.HTTPStatusError):
        return f"{e.response.status_code} {e.response.reason_phrase}".rstrip()
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json().get("message") or r.text[:200])
    except ValueError:
        return r.text[:200]


def _code(r: httpx.Response) -> str | None:
    try:
        return r.json().get("code")
    except ValueError:
        return None
