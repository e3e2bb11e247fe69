"""The console as the app serves it: every page module (each joins `base.router` when imported) and its static
files. `astraeus.app` includes it; the server never imports the console."""

from __future__ import annotations

from fastapi import FastAPI

from astraeus.console import (
    audit_pages,
    pages,
    port_pages,
    replica_group_pages,
    reservation_pages,
    schedule_pages,
    sso_pages,
    usage_pages,
)
from astraeus.console.base import STATIC, router, static_files

# imported for their routes
PAGES = (audit_pages, pages, port_pages, replica_group_pages, reservation_pages, schedule_pages, sso_pages, usage_pages)


def include(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(STATIC, static_files(), name="console-static")
