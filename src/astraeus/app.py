"""The web app a control plane serves: the API (`astraeus.server.app.create_api`) with the console's pages on top.
It sits above both, so that the server never imports the console."""

from __future__ import annotations

from fastapi import FastAPI

from astraeus.console import site
from astraeus.server.app import create_api
from astraeus.server.core import ControlPlane
from astraeus.settings import ServerSettings


def create_app(settings: ServerSettings | None = None, cp: ControlPlane | None = None, run_loop: bool = True) -> FastAPI:
    app = create_api(settings, cp, run_loop)
    site.include(app)
    return app
