"""The web console: server-rendered pages over the same service functions and body models as the API.

`pages.router` holds the pages (the app includes it through `astraeus.server.routers.console`). Pages are Jinja2
templates; the live parts (the runs table, a run's status, logs, events, machines) are HTML fragments that
`static/console.js` fetches about once a second. Sign-in exchanges an API token for a console session
(its own secret in an HttpOnly cookie; a CSRF token in every form; POSTs from another origin refused); scripts
may send `Authorization: Bearer` instead. A form becomes the API's JSON body (`forms`), validated by the API's model.
"""
