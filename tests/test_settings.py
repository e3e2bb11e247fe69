"""Typed settings (astraeus.settings): a bad ASTRAEUS_* value stops a program at start with one line naming the
variable; docs/configuration.md lists every setting."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from astraeus import settings as S
from astraeus.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"


def _clean_env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")}
    env["HOME"] = str(tmp_path)
    env.update(extra)
    return env


@pytest.mark.parametrize("argv, var, value, line", [
    (["server"], "ASTRAEUS_HEARTBEAT", "abc",
     'astraeus server: ASTRAEUS_HEARTBEAT: must be a number of seconds > 0, got "abc"'),
    (["server"], "ASTRAEUS_DATABASE_URL", "db.example.com",
     "astraeus server: ASTRAEUS_DATABASE_URL: must be a database URL such as "
     'postgresql+psycopg://user@host:5432/astraeus or sqlite:///path, got "db.example.com"'),
    (["server"], "ASTRAEUS_LOG_STORES_AT_ONCE", "0",
     'astraeus server: ASTRAEUS_LOG_STORES_AT_ONCE: must be a whole number from 1 to 64, got "0"'),
    (["server"], "ASTRAEUS_LOG_STORE_SHARE", "0",
     'astraeus server: ASTRAEUS_LOG_STORE_SHARE: must be a number from 0.05 to 1, got "0"'),
    (["server"], "ASTRAEUS_LOG_STORE_SHARE", "half",
     'astraeus server: ASTRAEUS_LOG_STORE_SHARE: must be a number from 0.05 to 1, got "half"'),
    (["up"], "ASTRAEUS_IMAGE_MAP", "[1]",
     'astraeus up: ASTRAEUS_IMAGE_MAP: must be a JSON object {"image glob": "environment dir"} or the path of a '
     'file holding one, got "[1]"'),
    (["agent", "--server", "http://127.0.0.1:1", "--token", "x"], "ASTRAEUS_STOP_GRACE", "-1",
     'astraeus agent: ASTRAEUS_STOP_GRACE: must be a number of seconds >= 0, got "-1"'),
    (["agent", "--server", "http://127.0.0.1:1", "--token", "x"], "ASTRAEUS_WORKER_NETWORK", "bridge",
     'astraeus agent: ASTRAEUS_WORKER_NETWORK: must be isolated or host, got "bridge"'),
    (["agent", "--server", "http://127.0.0.1:1", "--token", "x"], "ASTRAEUS_WORKER_EGRESS", "open",
     'astraeus agent: ASTRAEUS_WORKER_EGRESS: must be internet, none or all, got "open"'),
    (["agent", "--server", "http://127.0.0.1:1", "--token", "x"], "ASTRAEUS_WORKER_EGRESS_ALLOW", "10.0.0.0/33",
     "astraeus agent: ASTRAEUS_WORKER_EGRESS_ALLOW: must be comma-separated IPv4 addresses or networks, such as "
     '10.0.5.0/24,10.0.9.7, got "10.0.0.0/33"'),
    (["agent", "--token", "x"], "ASTRAEUS_SERVER", "cp-host:8420",
     'astraeus agent: ASTRAEUS_SERVER: must be an http:// or https:// URL, or several comma-separated, got '
     '"cp-host:8420"'),
])
def test_bad_value_stops_the_program_with_one_line_naming_it(tmp_path, argv, var, value, line):
    p = subprocess.run([sys.executable, "-m", "astraeus.main", *argv], env=_clean_env(tmp_path, **{var: value}),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.splitlines() == [line], p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    assert not (tmp_path / ".astraeus").exists()  # nothing was created


def test_agent_without_server_says_which_to_set(tmp_path):
    p = subprocess.run([sys.executable, "-m", "astraeus.main", "agent", "--token", "x"], env=_clean_env(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == ("astraeus agent: missing --server (or ASTRAEUS_SERVER): the control plane's URL "
                                "and a machine token")


def test_values_come_from_the_environment_and_keywords_win(monkeypatch, tmp_path):
    for k in [k for k in os.environ if k.startswith("ASTRAEUS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("ASTRAEUS_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("ASTRAEUS_HEARTBEAT", "2.5")
    monkeypatch.setenv("ASTRAEUS_PUBLIC_URL", "https://console.example.com/")
    monkeypatch.setenv("ASTRAEUS_STOP_GRACE", "0")
    monkeypatch.setenv("ASTRAEUS_SCHEDULE_INTERVAL", "")  # empty: unset
    s = ServerSettings()
    assert (s.home, s.heartbeat, s.schedule_interval) == (tmp_path / "h", 2.5, 15)
    assert s.console_base() == "https://console.example.com"
    assert ServerSettings(home=tmp_path, heartbeat=1, port=9).heartbeat == 1
    assert ServerSettings.load(home=tmp_path / "x", port=9, host=None).console_base() == "https://console.example.com"
    with pytest.raises(TypeError, match="no field heartbeat_seconds"):  # a misspelt keyword is not dropped
        ServerSettings(heartbeat_seconds=1)
    agent = S.AgentSettings.load()
    assert agent.stop_grace == 0  # 0 s is a value, not "unset"
    assert agent.state_dir_for("gpu-01") == tmp_path / "h" / "agents" / "gpu-01"
    monkeypatch.setenv("ASTRAEUS_SCHEDULE_INTERVAL", "0")
    with pytest.raises(S.SettingsError, match='^ASTRAEUS_SCHEDULE_INTERVAL: must be a number of seconds > 0, got "0"$'):
        S.ServerSettings.load()
    monkeypatch.setenv("ASTRAEUS_SCHEDULE_INTERVAL", "15")
    monkeypatch.setenv("ASTRAEUS_HEARTBEAT", "soon")
    with pytest.raises(S.SettingsError, match='^ASTRAEUS_HEARTBEAT: must be a number of seconds > 0, got "soon"$'):
        ServerSettings(home=tmp_path)


def test_host_and_port_are_options_not_variables(monkeypatch, tmp_path):
    """The control plane's one settings object holds --host and --port too, but never reads them from the
    environment, and the doc does not list them."""
    monkeypatch.setenv("ASTRAEUS_HOST", "10.9.9.9")
    monkeypatch.setenv("ASTRAEUS_PORT", "1")
    s = ServerSettings(home=tmp_path)
    assert (s.host, s.port) == ("127.0.0.1", 8420)
    assert ServerSettings(home=tmp_path, host="0.0.0.0", port=9).console_base() == "http://0.0.0.0:9"
    assert "ASTRAEUS_HOST" not in DOC.read_text()


def test_the_cached_settings_follow_a_changed_variable(monkeypatch):
    monkeypatch.setenv("ASTRAEUS_RESTART_BACKOFF_BASE", "3")
    assert S.server_settings().restart_backoff_base == 3
    assert S.server_settings() is S.server_settings()  # read once
    monkeypatch.setenv("ASTRAEUS_RESTART_BACKOFF_BASE", "4")
    assert S.server_settings().restart_backoff_base == 4
    monkeypatch.setenv("ASTRAEUS_STOP_GRACE", "7")
    assert S.agent_settings().stop_grace == 7
    with pytest.raises(KeyError):
        S.internal("PATH")  # only the documented internal variables


def test_the_doc_lists_every_setting_and_is_current():
    doc = DOC.read_text()
    for model in S.MODELS:
        for field, info in model.variables().items():
            assert f"| `{model.env_name(field)}` |" in doc, model.env_name(field)
            assert info.description and info.description in doc
    assert doc == S.markdown(), "regenerate it: python -m astraeus.settings > docs/configuration.md"


def test_every_astraeus_variable_in_the_code_is_documented():
    doc = DOC.read_text()
    names = set()
    for path in (ROOT / "src").rglob("*.py"):
        names |= set(re.findall(r"\bASTRAEUS_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    missing = sorted(n for n in names if n not in doc)
    assert not missing, f"not in docs/configuration.md: {missing}"


def test_readme_links_the_configuration_page():
    assert "docs/configuration.md" in (ROOT / "README.md").read_text()
