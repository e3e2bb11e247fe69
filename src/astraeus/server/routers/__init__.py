"""The control plane's HTTP routers, one module per resource; each is a module-level `router`.

app.create_api includes them; `deps` gives them the session, the token, the caller and the control plane.
The console's pages are in `astraeus.console`, above the server: `astraeus.app` adds them to the app.
"""
