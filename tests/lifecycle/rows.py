"""Rows for the direct lifecycle tests, made as the API makes them, and the steps that move them (each a
call of server/lifecycle.py, as the API, the scheduling loop or an agent report makes it)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus.server import lifecycle as L
from astraeus.server.db import Cluster, Event, History, Org, Workspace

T0 = 1_000_000.0


class World:
    """An org, a cluster with machines gpu-01 and gpu-02, a workspace; runs made as the API makes them."""

    def __init__(self, s: Session):
        self.s = s
        org = Org(name="acme")
        s.add(org)
        s.flush()
        self.cluster = Cluster(org_id=org.id, name="main", preemption=True, lost_after_seconds=60)
        self.ws = Workspace(org_id=org.id, name="vision", ns="ws-0123456789ab")
        s.add_all([self.cluster, self.ws])
        s.flush()
        self.machines = {}
        for name in ("gpu-01", "gpu-02"):
            m, _ = L.machine_registered(s, None, self.cluster, name, T0)
            m.gpus = 8
            self.machines[name] = m
        s.flush()
        self.runs = 0

    def run(self, name: str = "r", workers: int = 1, *, policy: str = "OnFailure", budget: int = 10,
            limit: int | None = None, start: str = "Gang"):
        tt = {"image": "python:3.11", "command": "true", "restart_policy": policy, "max_restarts": budget}
        if limit:
            tt["time_limit_seconds"] = limit
        run = L.new_run(uid=f"uid{self.runs}", workspace_id=self.ws.id, cluster_id=self.cluster.id, name=name,
                        spec={"start": start, "task_template": tt}, priority=0, created_at=T0)
        self.runs += 1
        self.s.add(run)
        self.s.flush()
        for i in range(workers):
            self.s.add(L.new_worker(run_id=run.id, name=f"{name}-{i}", index=i, gpus=1, gpu_indices=[], why_not=[]))
        self.s.flush()
        self.s.refresh(run)
        return run

    def history(self, run) -> list[tuple[str, str]]:
        return [(h.state, h.reason) for h in self.s.scalars(select(History).where(History.run_id == run.id)
                                                               .order_by(History.id))]

    def events(self) -> list[tuple[str, str, str]]:
        return [(e.kind, e.object, e.message) for e in self.s.scalars(select(Event).order_by(Event.id))]


# ------------------------------------------------------------------------------------- steps of a case


def place(i, machine="gpu-01"):
    def step(w: World, run, at):
        m = w.machines[machine]
        L.place(w.s, run, run.workers[i], m.id, [i], 1.0, 0, at, m.name)
        L.refresh_run(w.s, run, at)
    return step


def running(i, pid=4242):
    return lambda w, run, at: L.running(w.s, run, run.workers[i], pid, None, at)


def exits(i, code=None, sig=None):
    return lambda w, run, at: L.ended(w.s, run, run.workers[i], code, sig, None, at)


def start_fails(i, message):
    return lambda w, run, at: L.start_failed(w.s, run, run.workers[i], message, at)


def stop(i, kind, reason):
    def step(w, run, at):
        L.request_stop(w.s, run, run.workers[i], kind, reason, at)
        L.refresh_run(w.s, run, at)
    return step


def preempt(idx, head, reason):
    def step(w, run, at):
        L.preempt(w.s, run, [run.workers[i] for i in idx], head, reason, at)
        L.refresh_run(w.s, run, at)
    return step


def delete():
    return lambda w, run, at: L.delete(w.s, run, at)


def machine_lost(machine="gpu-01"):
    def step(w, run, at):
        m = w.machines[machine]
        ws = [x for x in run.workers if x.machine_id == m.id and x.state in L.ACTIVE]
        L.machine_lost(w.s, m, ws, at)
    return step
