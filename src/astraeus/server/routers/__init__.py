"""The control plane's HTTP routers, one module per resource; each is a module-level `router`.

app.create_app includes them; `deps` gives them the session, the token, the caller and the control plane.
The console's pages are in `console` (which imports astraeus.console: the server's one way into it).
"""
