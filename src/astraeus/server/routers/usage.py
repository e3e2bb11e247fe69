"""Accounting: GPU-hours and the rest of a workspace's (or the organisation's) usage, added up from the usage records
of worker attempts (services/usage.py; docs/usage.md)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server.routers.deps import AdminCaller, Sess, WsCaller
from astraeus.server.routers.workspace import PREFIX
from astraeus.server.services import usage

router = APIRouter(responses=B.ERRORS)

GroupBy = Annotated[list[str] | None, Query(description="workspace, user, run, gpu_model, day or cluster; several "
                                                        "allowed (repeated, or comma-separated)")]
Since = Annotated[str | None, Query(max_length=64, description="7d, 12h, 2030-01-01, 2030-01-01T12:00:00Z; "
                                                               "default 7 days ago")]
Until = Annotated[str | None, Query(max_length=64, description="as since; default now")]
RunName = Annotated[str | None, Query(max_length=63, description="only this run's records")]


@router.get(PREFIX + "/usage", tags=["workspace"], response_model=A.UsageOut, response_model_exclude_unset=True)
def workspace_usage(c: WsCaller, s: Sess, group_by: GroupBy = None, since: Since = None, until: Until = None):
    return usage.report(s, c.org, c.workspace, group_by, since, until, time.time())


@router.get(PREFIX + "/usage/records", tags=["workspace"], response_model=A.UsageRecordList, response_model_exclude_unset=True)
def workspace_usage_records(c: WsCaller, s: Sess, since: Since = None, until: Until = None, run: RunName = None):
    return usage.records(s, c.org, c.workspace, since, until, time.time(), run)


@router.get("/api/v1/o/{org}/usage", tags=["organisation"], response_model=A.UsageOut, response_model_exclude_unset=True)
def org_usage(c: AdminCaller, s: Sess, group_by: GroupBy = None, since: Since = None, until: Until = None):
    return usage.report(s, c.org, None, group_by, since, until, time.time())
