"""The web console: server-rendered pages over the same service functions as the API.

`mount(app, cp)` adds the pages to the control plane's app. Pages are Jinja2 templates; the live parts (the
runs table, a run's status, logs, events, machines) are HTML fragments that `static/console.js` fetches about
once a second. Sign-in stores the API token in a cookie; scripts may send `Authorization: Bearer` instead.
"""

from __future__ import annotations

from astraeus.console.pages import mount

__all__ = ["mount"]
