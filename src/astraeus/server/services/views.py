"""The JSON answers' shapes for runs, workers, drives, events and a workspace's access (answers.py declares them)."""

from __future__ import annotations

import time

from astraeus.server import lifecycle
from astraeus.server.db import (
    Access,
    Cluster,
    Drive,
    Event,
    History,
    Org,
    Run,
    Worker,
    Workspace,
)


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


PAUSED = "Paused to make room for higher-priority work"


def made_by(row) -> dict:
    """metadata.created_by and updated_by of a run, drive, template, schedule, replica group or reservation."""
    return {"created_by": row.created_by, "updated_by": row.updated_by}


def console_url(base: str, org: str, ws: str, cluster: str, run: str) -> str:
    return f"{base}/o/{org}/w/{ws}/jobs/{cluster}/{run}"


def worker_view(w: Worker, machine_names: dict[int, str] | None = None) -> dict:
    tt = w.run.spec["task_template"]
    mname = None
    if w.machine_id is not None:
        mname = (machine_names or {}).get(w.machine_id) or (w.machine.name if w.machine else None)
    return {
        "name": w.name, "run": w.run.name, "index": w.index, "state": w.state,
        "reason": lifecycle.worker_reason(w, time.time()),
        "restarts": w.restarts, "preemptions": w.preemptions, "exit_code": w.exit_code, "machine": mname,
        "gpu_indices": list(w.gpu_indices or []), "cpu_cores": w.cpu_cores, "memory_bytes": w.memory_bytes,
        "attempt": w.attempt, "pid": w.pid, "image": tt["image"], "environment": w.environment,
        "placed_at": iso(w.placed_at), "started_at": iso(w.started_at), "finished_at": iso(w.finished_at),
        "why_not": [{"machine": m, "reason": r} for m, r in (w.why_not or [])],
        # issue 46: its share of its one GPU; a MIG worker's devices instead, [gpu, profile, k] each
        **({"mig_devices": [list(d) for d in w.mig_devices]} if w.mig_devices else
           {"gpu_fraction": w.gpu_milli / 1000} if w.gpu_milli else {}),
    }


HIDDEN = "******"  # what a value the caller may not see reads as (docs/api.md, "Secrets")


def shown_template(tt: dict, role: str | None) -> dict:
    """A task template as `role` may see it: env and config values only for editors and admins, and a value
    marked secret for nobody; the names, mounts and the secret flags stay."""
    reveal = role in ("editor", "admin")
    env = {}
    for k, v in (tt.get("env") or {}).items():
        if isinstance(v, dict):
            env[k] = {**v, "value": HIDDEN if v.get("secret") or not reveal else v.get("value")}
        else:
            env[k] = v if reveal else HIDDEN
    configs = [{**c, "value": HIDDEN if c.get("secret") or not reveal else c.get("value")}
               for c in tt.get("configs") or []]
    return {**tt, "env": env, "configs": configs}


def run_view(run: Run, org: Org, ws: Workspace, cluster: Cluster, base: str, history: list[History] | None = None,
             machine_names: dict[int, str] | None = None, role: str | None = None) -> dict:
    """A run as the API shows it to a caller with `role` (None: as to a viewer; see shown_template)."""
    status = {
        "state": run.state, "reason": lifecycle.run_reason(run, time.time()), "queue_reason": run.queue_reason,
        "workers": [worker_view(w, machine_names) for w in run.workers],
        "preemptions": run.preemptions,
        "restarts": sum(w.restarts for w in run.workers),
        "started_at": iso(run.started_at), "finished_at": iso(run.finished_at),
        "console_url": console_url(base, org.name, ws.name, cluster.name, run.name),
        "held": bool(run.held),
    }
    if run.preempted_by and run.state == "Pending":
        status["console_reason"] = PAUSED
    if history is not None:
        status["history"] = [{"time": iso(h.time), "state": h.state, "reason": h.reason} for h in history]
    spec = dict(run.spec)
    spec["cluster"] = cluster.name
    spec["task_template"] = shown_template(spec["task_template"], role)
    return {
        "metadata": {"name": run.name, "job_id": run.id, "labels": run.labels or {}, "uid": run.uid, "workspace": ws.name,
                     "namespace": ws.ns, "cluster": cluster.name, "created_at": iso(run.created_at),
                     **made_by(run),
                     # the run template it was made from, and that template's version then (docs/api.md)
                     "template": {"name": run.template, "version": run.template_version} if run.template else None},
        "spec": spec,
        "status": status,
    }


def drive_view(d: Drive, ws: Workspace, cluster: Cluster) -> dict:
    return {"metadata": {"name": d.name, "workspace": ws.name, "namespace": ws.ns, "cluster": cluster.name,
                         "created_at": iso(d.created_at), **made_by(d)},
            "spec": d.spec, "status": {"state": "Ready"}}




def event_view(e: Event) -> dict:
    return {"time": iso(e.time), "kind": e.kind, "object": e.object, "message": e.message}


def access_view(c: Cluster, a: Access) -> dict:
    return {"name": c.name, "max_priority": a.max_priority, "weight": a.weight, "host_paths": a.host_paths or [],
            "host_network": bool(a.host_network), "default_image": a.default_image, "max_gpus_per_user": a.max_gpus_per_user,
            "preemption": c.preemption, "pools": list(a.pools) if a.pools is not None else None,
            "quota": {"gpus": a.quota_gpus, "cpu_cores": a.quota_cpu_cores, "memory_bytes": a.quota_memory_bytes,
                      "workers": a.quota_workers}}
