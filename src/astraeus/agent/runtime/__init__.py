"""Worker runtimes. Kept import-light: the per-worker shim (`python -m astraeus.agent.runtime.shim`) imports
this package, so nothing heavy belongs here."""
