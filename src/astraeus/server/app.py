"""The control plane's HTTP app, assembled: error handlers, the scheduling loop's lifespan, and the routers.

Every route lives in `astraeus.server.routers` (one module per resource); they read the ControlPlane from
`app.state.cp`, so this module only puts it there and includes them.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from astraeus.server.core import ControlPlane, Settings
from astraeus.server.loop import SchedulingLoop
from astraeus.server.routers import admin, agent, drives, errors, events, health, machines, runs, workers, workspace
from astraeus.server.services import tx

__all__ = ["create_app", "tx"]

# Long-polls and log follows each hold a worker thread; allow many (one per agent, plus followers).
THREADS = 400

# In the order /openapi.json lists them.
ROUTERS = (health, workspace, runs, workers, drives, events, machines, admin, agent)


def create_app(settings: Settings | None = None, cp: ControlPlane | None = None, run_loop: bool = True) -> FastAPI:
    settings = settings or Settings()
    cp = cp or ControlPlane.open(settings)
    loop = SchedulingLoop(cp)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
        if run_loop:
            loop.start()
            cp.notifier.wake_scheduler()
        yield
        if run_loop:
            loop.stop()

    app = FastAPI(title="Astraeus", version="0.1.0", lifespan=lifespan,
                  description="GPU cluster workload manager: runs, workers, drives, machines.")
    app.state.cp = cp
    app.state.loop = loop
    errors.install(app)
    for module in ROUTERS:
        app.include_router(module.router)

    try:  # the console, when its package is installed (the server imports it here only, at assembly)
        from astraeus.server.routers import console
    except ModuleNotFoundError as e:
        if e.name != "astraeus.console":
            raise
    else:
        console.include(app)

    app.openapi_schema = None
    return app
