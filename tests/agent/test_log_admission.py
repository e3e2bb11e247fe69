"""Log admission (routers/agent.py): while too many batches of log lines are being stored, POST /api/v1/agent/logs
answers 429 with Retry-After, and the agent keeps the refused lines and ships them after it: none lost, none twice,
in order. The real control plane (uvicorn in a thread, SQLite) and the real agent running a real worker."""

from __future__ import annotations

import logging
import threading

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
            for _ in range(5):  # the agent's own batch may be one of those held: then again
                # Stores on SQLite take the process's state lock: held here, the stores in flight wait for it and
                # the batches behind them fill the admission; the agent's next batch is refused.
                held: list[threading.Thread] = []
                with STATE_LOCK:
                    def filler():
                        with httpx.Client(timeout=30) as fc:
                            r = fc.post(f"{server['url']}/api/v1/agent/logs", json={"machine": "gpu-01", "lines": []},
                                        headers={"Authorization": f"Bearer {agent.credential}"})
                            if r.status_code == 429:
                                refused.append(r)
                    for _ in range(LOG_STORES_AT_ONCE + LOG_STORES_WAITING + 1):
                        t = threading.Thread(target=filler)
                        t.start()
                        held.append(t)
                    wait_for(lambda: refused, timeout=10, what="a batch refused: the admission full")
                    try:
                        wait_for(deferred, timeout=3, what="the agent's batch refused")
                    except AssertionError:
                        pass
                for t in held:
                    t.join(timeout=30)
                if deferred():
                    break
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
