"""The web console's pages: the server's one import of `astraeus.console` (which imports the server, never the
reverse). Its router and static files are added to the app by `include`."""

from __future__ import annotations

from fastapi import FastAPI

from astraeus.console.pages import STATIC, router, static_files

__all__ = ["include", "router"]


def include(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(STATIC, static_files(), name="console-static")
