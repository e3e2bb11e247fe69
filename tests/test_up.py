"""`astraeus up` (issue 42, item 10): with the database elsewhere (ASTRAEUS_DATABASE_URL) and a --home that does not
exist yet, it makes the home (its agents' state and logs live there) and serves, instead of crashing with
FileNotFoundError on the first agent's log."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx

from tests.conftest import VENV_BIN, drop_postgres, free_port, postgres_url, wait_for


def test_up_with_a_database_url_makes_a_home_that_does_not_exist(tmp_path):
    url = postgres_url()
    home = tmp_path / "not" / "yet"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")}
    env.update(ASTRAEUS_DATABASE_URL=url, ASTRAEUS_RUNTIME="process", ASTRAEUS_HEARTBEAT="1")
    log = open(tmp_path / "up.log", "wb")
    p = subprocess.Popen([str(VENV_BIN / "astraeus"), "up", "--home", str(home), "--port", str(port), "--gpus", "1"],
                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for(lambda: p.poll() is not None or (home / "env").exists(), timeout=60, what="up serving")
        said = (tmp_path / "up.log").read_text()
        assert p.poll() is None, said
        assert "Traceback" not in said and "FileNotFoundError" not in said, said
        exported = dict(ln.removeprefix("export ").split("=", 1) for ln in (home / "env").read_text().splitlines())
        machines = wait_for(lambda: httpx.get(f"{exported['ASTRAEUS_API']}/machines", timeout=10, headers={
            "Authorization": f"Bearer {exported['ASTRAEUS_TOKEN']}"}).json()["items"], timeout=30, what="gpu-01")
        assert [m["name"] for m in machines] == ["gpu-01"]
        assert (home / "agent-gpu-01.log").exists()
        assert oct(home.stat().st_mode & 0o777) == "0o700"
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)
        drop_postgres(url)
