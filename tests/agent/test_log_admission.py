"""Log admission (server/log_admission.py): while too many batches of log lines are being stored, POST /api/v1/agent/logs
answers 429 with Retry-After, and the agent keeps the refused lines and ships them after it: none lost, none twice,
in order. The real control plane (uvicorn in a thread, SQLite) and the real agent running a real worker."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from astraeus import protocol as P
from astraeus.agent.agent import Agent
from astraeus.server.log_admission import (
    LOG_RETRY_AFTER,
    LOG_STORES_WAITING,
    SMALL_BATCH_BYTES,
    SMALL_STORES_AT_ONCE,
    SMALL_STORES_WAITING,
)
from astraeus.server.state_lock import STATE_LOCK

from .conftest import wait_for

LINES = 150  # at least this many shown at the end; the worker prints until it is stopped (a refusal may take tries)
SCRIPT = ("import itertools, time\n"  # long lines: what piles up while shipping is held is a big batch
          "for i in itertools.count():\n"
          "    print(f'line {i:06d} ' + 'x' * 3000, flush=True)\n"
          "    time.sleep(0.04)\n")
QUIET = ("import itertools, time\n"
         "for i in itertools.count():\n"
         "    print(f'quiet {i:06d}', flush=True)\n"
         "    time.sleep(0.1)\n")
FLOOD = ("import itertools, time\n"  # about 6,000 lines a second: more than its share of every round
         "for i in itertools.count():\n"
         "    print(f'flood {i:07d}', flush=True)\n"
         "    if i % 300 == 0:\n"
         "        time.sleep(0.05)\n")


def at_once(server) -> int:
    """How many batches the server stores at once (ASTRAEUS_LOG_STORES_AT_ONCE)."""
    return server["cp"].settings.log_stores_at_once


def big_batch(machine: str = "gpu-01") -> dict:
    """A batch past SMALL_BATCH_BYTES (the big lane), of lines naming no worker of the machine (none is stored)."""
    lines = [{"worker": "nobody.nobody-0", "seq": i, "text": "x" * 100} for i in range(SMALL_BATCH_BYTES // 100 + 10)]
    return {"machine": machine, "lines": lines}


def _run(name: str, script: str = SCRIPT) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime", "command": "python", "args": ["/app/w.py"],
        "restart_policy": "Never",
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 30, "gpu_requests": {"count": 1}},
        "configs": [{"mounts": ["/app/w.py"], "value": script}]}}}


def registered(server) -> dict:
    """gpu-01 registered with the join token: the Authorization header of its own credential."""
    with httpx.Client(timeout=30) as c:
        r = c.post(f"{server['url']}/api/v1/agent/register", json={"name": "gpu-01", "gpus": 1},
                   headers={"Authorization": f"Bearer {server['machine_token']}"})
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['credential']}"}


@contextmanager
def joined_agent(server, tmp_path):
    """The real agent as gpu-01, joined, and a client of the API as the workspace's user; the agent stopped after."""
    agent = Agent(server["url"], server["machine_token"], "gpu-01", gpus=2, cpu_cores=8, memory_bytes=64 << 30,
                  state_dir=str(tmp_path / "agent"), stop_grace=2, poll_wait=5, stop_workers_on_exit=True)
    agent.start()
    try:
        h = {"Authorization": f"Bearer {server['token']}"}
        with httpx.Client(base_url=server["api"], headers=h, timeout=30) as c:
            wait_for(lambda: c.get("/machines").json()["items"], timeout=20, what="the machine to join")
            yield agent, c
    finally:
        agent.request_exit()
        agent.shutdown()


def test_a_refused_batch_of_lines_is_shipped_after_retry_after(server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="astraeus.agent")
    with joined_agent(server, tmp_path) as (agent, c):
        assert c.post("/runs", json=_run("chatty")).status_code == 201
        wait_for(lambda: "line 000005" in c.get("/workers/chatty-0/logs").text, timeout=30, what="first lines")

        def deferred() -> bool:
            return any("log lines deferred" in r.getMessage() for r in caplog.records)

        refused: list[httpx.Response] = []
        # Stores on SQLite take the process's state lock: held here, the stores in flight wait for it and the
        # batches behind them fill the admission; then the agent's next batch is refused. The agent's own
        # shipping is held back (its ship lock, taken once its batch in flight is answered) until the
        # admission is full, so that its next batch comes after the others, not among those held.
        agent.ship_lock.acquire()
        STATE_LOCK.acquire()
        shipping_held = True
        held: list[threading.Thread] = []
        try:
            def filler():
                with httpx.Client(timeout=60) as fc:
                    r = fc.post(f"{server['url']}/api/v1/agent/logs", json=big_batch(),
                                headers={"Authorization": f"Bearer {agent.credential}"})
                    if r.status_code == 429:
                        refused.append(r)
            for _ in range(at_once(server) + LOG_STORES_WAITING + 1):
                t = threading.Thread(target=filler)
                t.start()
                held.append(t)
            wait_for(lambda: refused, timeout=20, what="a batch refused: the admission full")
            time.sleep(1.5)  # the worker's lines pile up past SMALL_BATCH_BYTES: the agent's batch is a big one
            agent.ship_lock.release()  # now the agent's next batch finds the admission full
            shipping_held = False
            wait_for(deferred, timeout=20, what="the agent's batch refused")
        finally:
            if shipping_held:
                agent.ship_lock.release()
            STATE_LOCK.release()
            for t in held:
                t.join(timeout=60)
        assert deferred(), "the agent never had a batch refused"
        r = refused[0]
        assert r.headers["Retry-After"] == str(LOG_RETRY_AFTER)
        assert r.json()["code"] == "BUSY"

        def shown() -> list[str]:
            return [ln.split()[1] for ln in c.get("/workers/chatty-0/logs").text.splitlines()
                    if ln.startswith("line ")]

        at_refusal = len(shown())
        wait_for(lambda: len(shown()) >= at_refusal + LINES, timeout=60, what="the lines after the refusal")
        lines = shown()
        assert lines == [f"{i:06d}" for i in range(len(lines))]  # none lost, none twice, in order


def test_an_unauthenticated_flood_gets_401s_and_takes_no_admission_slot(server):
    """Batches whose bearer token is no machine token (none, garbage, not a bearer token, a user's token) get
    their 401 (403) at once, before admission counts them: while every store waits (the state lock held) and the
    admission is one short of full, a flood of them is refused without waiting, and a real credential's batch is
    still admitted (not 429) and stored once the stores go on."""
    url = f"{server['url']}/api/v1/agent/logs"
    cred = registered(server)
    batch = big_batch()
    bad = [({}, 401), ({"Authorization": "Bearer not-a-token"}, 401), ({"Authorization": "Basic Zm9vOmJhcg=="}, 401),
           ({"Authorization": f"Bearer {server['token']}"}, 403)]  # a user's token
    real: list[int] = []
    flood: list[int] = []

    def post_real():
        with httpx.Client(timeout=30) as fc:
            real.append(fc.post(url, json=batch, headers=cred).status_code)

    def post_bad(h: dict):
        with httpx.Client(timeout=30) as fc:
            for _ in range(10):
                flood.append(fc.post(url, json={"machine": "gpu-01", "lines": [], "pad": "x" * 50_000},
                                     headers=h).status_code)

    held: list[threading.Thread] = []
    with STATE_LOCK:  # the stores wait for it: the admitted batches stay counted meanwhile
        for _ in range(at_once(server) + LOG_STORES_WAITING - 1):
            t = threading.Thread(target=post_real)
            t.start()
            held.append(t)
        time.sleep(1.0)  # the real batches are admitted and wait for the lock
        assert not real, f"answered while the state lock was held: {real}"
        flooders = [threading.Thread(target=post_bad, args=(h,)) for h, _ in bad for _ in range(3)]
        for t in flooders:
            t.start()
        for t in flooders:
            t.join(timeout=20)
        assert not any(t.is_alive() for t in flooders), "the flood's batches waited: they were admitted"
        assert len(flood) == len(flooders) * 10
        assert set(flood) <= {401, 403} and 401 in flood, sorted(set(flood))
        # one slot is still free: a real batch is admitted, not refused with 429
        last = threading.Thread(target=post_real)
        last.start()
        held.append(last)
        time.sleep(1.0)
        assert 429 not in real, real
    for t in held:
        t.join(timeout=30)
    assert real == [200] * (at_once(server) + LOG_STORES_WAITING), real
    # and each of the bad tokens is refused with its own status, also when the admission is empty
    with httpx.Client(timeout=30) as c:
        for h, status in bad:
            r = c.post(url, json=batch, headers=h)
            assert r.status_code == status, (h, r.text)


@pytest.mark.parametrize("server, stores_at_once", [({}, 1), ({"log_stores_at_once": 3}, 3)], indirect=["server"],
                         ids=["default", "three-at-once"])
def test_a_small_batch_has_a_lane_of_its_own_while_the_flood_fills_admission(server, stores_at_once):
    """While the big batches fill their admission (stores waiting on SQLite's state lock, held here), a small batch
    (at most SMALL_BATCH_BYTES) is still admitted, and stored once the stores go on; the small lane has its own
    bound, past which a small batch gets the same 429. The big lane admits ASTRAEUS_LOG_STORES_AT_ONCE (1 unless
    set) stores and LOG_STORES_WAITING more."""
    url = f"{server['url']}/api/v1/agent/logs"
    cred = registered(server)
    codes: dict[str, list[int]] = {"big": [], "small": []}

    def post(kind: str):
        with httpx.Client(timeout=60) as fc:
            body = big_batch() if kind == "big" else {"machine": "gpu-01", "lines": []}
            codes[kind].append(fc.post(url, json=body, headers=cred).status_code)

    def start(kind: str, n: int) -> list[threading.Thread]:
        ts = [threading.Thread(target=post, args=(kind,)) for _ in range(n)]
        for t in ts:
            t.start()
        return ts

    held: list[threading.Thread] = []
    with STATE_LOCK:
        held += start("big", stores_at_once + LOG_STORES_WAITING + 1)
        wait_for(lambda: codes["big"] == [429], timeout=20, what="a big batch refused: its admission full")
        held += start("small", SMALL_STORES_AT_ONCE + SMALL_STORES_WAITING)
        time.sleep(1.0)
        assert codes["small"] == [], f"small batches answered while the state lock was held: {codes['small']}"
        held += start("small", 1)  # past the small lane's own bound
        wait_for(lambda: codes["small"] == [429], timeout=20, what="a small batch refused: its lane full")
    for t in held:
        t.join(timeout=60)
    assert sorted(codes["big"]) == [200] * (stores_at_once + LOG_STORES_WAITING) + [429]
    assert sorted(codes["small"]) == [200] * (SMALL_STORES_AT_ONCE + SMALL_STORES_WAITING) + [429]


def quiet_and_flood(c: httpx.Client):
    """Runs "quiet" and "flood" submitted and both shipping; count(worker, word): its lines starting with word."""
    assert c.post("/runs", json=_run("quiet", QUIET)).status_code == 201
    assert c.post("/runs", json=_run("flood", FLOOD)).status_code == 201

    def count(worker: str, word: str) -> int:
        return sum(1 for ln in c.get(f"/workers/{worker}-0/logs").text.splitlines() if ln.startswith(word))

    wait_for(lambda: count("quiet", "quiet") >= 3 and count("flood", "flood") > 2000, timeout=60,
             what="both workers' first lines")
    return count


def test_while_a_batch_is_deferred_a_quiet_workers_lines_still_ship(server, tmp_path):
    """After the control plane refused a batch (LogsDeferred sets `logs_deferred_until` to its Retry-After), the
    agent ships only the attempts that were quiet in its last round, at its usual pace; the flooding worker's
    lines wait until then, and none is lost."""
    with joined_agent(server, tmp_path) as (agent, c):
        count = quiet_and_flood(c)
        wait_for(lambda: {P.identity_name(k[0]) for k in agent.quiet_attempts} == {"quiet-0"}, timeout=20,
                 what="a round where the flood was behind and the quiet worker was not")
        agent.logs_deferred_until = time.monotonic() + 4.0  # as a 429 with Retry-After: 4 does
        time.sleep(0.8)  # a round already past its check finishes
        flood0, quiet0 = count("flood", "flood"), count("quiet", "quiet")
        time.sleep(1.5)
        assert count("flood", "flood") == flood0, "the flood's lines were shipped while deferred"
        assert count("quiet", "quiet") > quiet0, "the quiet worker's lines waited for the deferral"
        wait_for(lambda: count("flood", "flood") > flood0, timeout=30, what="the flood's lines after the deferral")
        quiet = [ln.split()[1] for ln in c.get("/workers/quiet-0/logs").text.splitlines()
                 if ln.startswith("quiet")]
        assert quiet == [f"{i:06d}" for i in range(len(quiet))]  # none lost, none twice, in order


def test_a_worker_that_floods_now_waits_out_the_deferral_though_it_was_quiet_before(server, tmp_path):
    """While deferred, the agent ships the attempts that were quiet in its last round only while they stay quiet:
    one that floods now (more new lines than its share) waits for the Retry-After with the rest and drops out of
    the quiet ones, so that its big posts neither go to the busy control plane nor hold back the quiet worker's
    lines; none is lost."""
    with joined_agent(server, tmp_path) as (agent, c):
        count = quiet_and_flood(c)
        agent.logs_deferred_until = time.monotonic() + 4.0  # as a 429 with Retry-After: 4 does
        time.sleep(0.8)  # a round already past its check finishes (and notes its quiet attempts)
        flooding = next(st.key for st in agent.runtime.list() if P.identity_name(st.worker) == "flood-0")
        agent.quiet_attempts = {*agent.quiet_attempts, flooding}  # as if it had been quiet in the last round
        flood0, quiet0 = count("flood", "flood"), count("quiet", "quiet")
        time.sleep(1.5)
        assert count("flood", "flood") == flood0, "the flood's lines were shipped while deferred"
        assert count("quiet", "quiet") > quiet0, "the quiet worker's lines waited for the deferral"
        assert flooding not in agent.quiet_attempts
        wait_for(lambda: count("flood", "flood") > flood0, timeout=30, what="the flood's lines after the deferral")
        quiet = [ln.split()[1] for ln in c.get("/workers/quiet-0/logs").text.splitlines()
                 if ln.startswith("quiet")]
        assert quiet == [f"{i:06d}" for i in range(len(quiet))]  # none lost, none twice, in order


@pytest.mark.parametrize("server", [{"log_store_share": 0.1}], indirect=True)
def test_a_flood_of_big_batches_takes_at_most_its_share_and_small_ones_do_not_wait(server):
    """ASTRAEUS_LOG_STORE_SHARE=0.1: a big batch whose store took t seconds keeps the next big one from starting
    for 9 t (the control plane spends at most a tenth of its time on a flood); the answer to the first does not
    wait for that rest, and a small batch (the quiet workers' lane) is stored meanwhile."""
    url = f"{server['url']}/api/v1/agent/logs"
    cred = registered(server)
    answered: dict[str, float] = {}

    def post(kind: str, body: dict) -> None:
        with httpx.Client(timeout=60) as fc:
            r = fc.post(url, json=body, headers=cred)
            assert r.status_code == 200, r.text
            answered[kind] = time.monotonic()

    hold = 0.6
    locked = threading.Event()

    def holder():  # a state change in progress: the first big store waits for it, so it takes at least `hold`
        with STATE_LOCK:
            locked.set()
            time.sleep(hold)

    h = threading.Thread(target=holder)
    h.start()
    locked.wait(10)
    post("big-1", big_batch())
    h.join()
    second = threading.Thread(target=post, args=("big-2", big_batch()))
    second.start()
    post("small", {"machine": "gpu-01", "lines": []})
    second.join(timeout=60)
    assert answered["small"] < answered["big-2"], "the small batch waited for the big lane's rest"
    # the second big store started at least 9 × hold after the first ended (and the first's answer did not wait)
    assert answered["big-2"] - answered["big-1"] >= 9 * hold * 0.9, answered
