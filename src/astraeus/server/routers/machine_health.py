"""Cordon, drain and resume a machine; inject and clear a GPU fault (issue 47, server/health.py). Organisation
admins only: `POST $ORG_API/machines/{name}/cordon|drain|resume`, `POST|DELETE $ORG_API/machines/{name}/gpus/{i}/fault`.
A name two clusters share takes `?cluster=NAME`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import Field

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import health, services
from astraeus.server.routers.deps import CP, AdminCaller, Sess, now, tx
from astraeus.spec import Strict

router = APIRouter(prefix="/api/v1/o/{org}", tags=["organisation"], responses=B.ERRORS)

ClusterQ = Annotated[str | None, Query(max_length=63, description="The machine's cluster, when two share its name")]
GpuIndex = Annotated[int, Path(ge=0, le=4095)]


class MachineAction(Strict):
    reason: Annotated[str, Field(max_length=health.REASON_MAX)] | None = Field(
        None, description="Why (shown with the machine and on the runs a drain stops); needed to cordon or drain")


class FaultBody(Strict):
    xid: Annotated[int, Field(ge=1, le=1_000_000)] = Field(description="The XID the GPU reports (79: fell off the bus)")
    what: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(None, description='Default "XID <xid>"')


def _out(s, m) -> dict:
    return services.machines_view(s, [m.cluster_id], [m])[0]


@router.post("/machines/{name}/{action}", response_model=A.MachineOut, response_model_exclude_unset=True)
def machine_action(name: str, action: Literal["cordon", "drain", "resume"], c: AdminCaller, s: Sess, cp: CP,
                   body: MachineAction | None = None, cluster: ClusterQ = None):
    with tx(s):
        m = health.admin_action(s, c, name, action, body.reason if body else None, now(), cluster)
        out = _out(s, m)
    cp.notifier.bump_machines({m.id})
    cp.notifier.wake_scheduler()
    return out


@router.post("/machines/{name}/gpus/{index}/fault", response_model=A.MachineOut, response_model_exclude_unset=True)
def inject_fault(name: str, index: GpuIndex, body: FaultBody, c: AdminCaller, s: Sess, cp: CP,
                 cluster: ClusterQ = None):
    with tx(s):
        m = health.inject_fault(s, c, name, index, body.xid, body.what, now(), cluster)
        out = _out(s, m)
    cp.notifier.bump_machines({m.id})
    cp.notifier.wake_scheduler()
    return out


@router.delete("/machines/{name}/gpus/{index}/fault", response_model=A.MachineOut, response_model_exclude_unset=True)
def clear_fault(name: str, index: GpuIndex, c: AdminCaller, s: Sess, cp: CP, cluster: ClusterQ = None):
    with tx(s):
        m = health.clear_fault(s, c, name, index, now(), cluster)
        out = _out(s, m)
    cp.notifier.wake_scheduler()
    return out
