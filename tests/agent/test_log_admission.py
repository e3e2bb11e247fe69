"""Log admission (routers/agent.py): while too many batches of log lines are being stored, POST /api/v1/agent/logs
answers 429 with Retry-After, and the agent keeps the refused lines and ships them after it: none lost, none twice,
in order. The real control plane (uvicorn in a thread, SQLite) and the real agent running a real worker."""

from __future__ import annotations

import logging
import threading
import time

import httpx

from astraeus.agent.agent import Agent
from astraeus.server.core import STATE_LOCK
from astraeus.server.routers.agent import LOG_RETRY_AFTER, LOG_STORES_AT_ONCE, LOG_STORES_WAITING

from .conftest import wait_for

LINES = 150  # at least this many shown at the end; the worker prints until it is stopped (a refusal may take tries)
SCRIPT = ("import itertools, time\n"
          "for i in itertools.count():\n"
          "    print(f'line {i:06d}', flush=True)\n"
          "    time.sleep(0.04)\n")


def _run(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime", "command": "python", "args": ["/app/w.py"],
        "restart_policy": "Never",
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 30, "gpu_requests": {"count": 1}},
        "configs": [{"mounts": ["/app/w.py"], "value": SCRIPT}]}}}


def test_a_refused_batch_of_lines_is_shipped_after_retry_after(server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="astraeus.agent")
    agent = Agent(server["url"], server["machine_token"], "gpu-01", gpus=2, cpu_cores=8, memory_bytes=64 << 30,
                  state_dir=str(tmp_path / "agent"), stop_grace=2, poll_wait=5, stop_workers_on_exit=True)
    agent.start()
    try:
        h = {"Authorization": f"Bearer {server['token']}"}
        with httpx.Client(base_url=server["api"], headers=h, timeout=30) as c:
            wait_for(lambda: c.get("/machines").json()["items"], timeout=20, what="the machine to join")
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
                        r = fc.post(f"{server['url']}/api/v1/agent/logs", json={"machine": "gpu-01", "lines": []},
                                    headers={"Authorization": f"Bearer {agent.credential}"})
                        if r.status_code == 429:
                            refused.append(r)
                for _ in range(LOG_STORES_AT_ONCE + LOG_STORES_WAITING + 1):
                    t = threading.Thread(target=filler)
                    t.start()
                    held.append(t)
                wait_for(lambda: refused, timeout=20, what="a batch refused: the admission full")
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
                return [ln for ln in c.get("/workers/chatty-0/logs").text.splitlines() if ln.startswith("line ")]

            at_refusal = len(shown())
            wait_for(lambda: len(shown()) >= at_refusal + LINES, timeout=60, what="the lines after the refusal")
            lines = shown()
            assert lines == [f"line {i:06d}" for i in range(len(lines))]  # none lost, none twice, in order
    finally:
        agent.request_exit()
        agent.shutdown()


def test_an_unauthenticated_flood_gets_401s_and_takes_no_admission_slot(server):
    """Batches whose bearer token is no machine token (none, garbage, not a bearer token, a user's token) get
    their 401 (403) at once, before admission counts them: while every store waits (the state lock held) and the
    admission is one short of full, a flood of them is refused without waiting, and a real credential's batch is
    still admitted (not 429) and stored once the stores go on."""
    url = f"{server['url']}/api/v1/agent/logs"
    with httpx.Client(timeout=30) as c:
        r = c.post(f"{server['url']}/api/v1/agent/register", json={"name": "gpu-01", "gpus": 1},
                   headers={"Authorization": f"Bearer {server['machine_token']}"})
        assert r.status_code == 200, r.text
        cred = {"Authorization": f"Bearer {r.json()['credential']}"}
    batch = {"machine": "gpu-01", "lines": []}
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
        for _ in range(LOG_STORES_AT_ONCE + LOG_STORES_WAITING - 1):
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
    assert real == [200] * (LOG_STORES_AT_ONCE + LOG_STORES_WAITING), real
    # and each of the bad tokens is refused with its own status, also when the admission is empty
    with httpx.Client(timeout=30) as c:
        for h, status in bad:
            r = c.post(url, json=batch, headers=h)
            assert r.status_code == status, (h, r.text)
