"""Configuration and error messages of the CLI's client (no server needed)."""

import json

import httpx
import pytest

from astraeus.cli.client import ApiError, Client, Config, error_message, load_config, save_config


def test_env_wins_over_the_config_file(tmp_path):
    cfg = tmp_path / "config.json"
    env = {"ASTRAEUS_CONFIG": str(cfg)}
    save_config("http://file/api/v1/o/a/w/b/", "file-token", env)
    assert json.loads(cfg.read_text()) == {"api": "http://file/api/v1/o/a/w/b", "token": "file-token"}
    assert cfg.stat().st_mode & 0o777 == 0o600
    assert load_config(env) == Config("http://file/api/v1/o/a/w/b", "file-token")
    env.update(ASTRAEUS_API="http://env/api", ASTRAEUS_TOKEN="env-token")
    assert load_config(env) == Config("http://env/api", "env-token")


def test_default_config_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    from astraeus.cli.client import config_path

    assert config_path({}) == tmp_path / ".config" / "astraeus" / "config.json"


def test_no_config_says_what_to_do(tmp_path):
    with pytest.raises(ApiError) as e:
        load_config({"ASTRAEUS_CONFIG": str(tmp_path / "none.json")})
    assert "astra login" in e.value.message and "ASTRAEUS_API" in e.value.message


def test_broken_config_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text("{not json")
    with pytest.raises(ApiError, match="cannot read the config file"):
        load_config({"ASTRAEUS_CONFIG": str(p)})


def resp(status, body=None, text=None):
    req = httpx.Request("GET", "http://x/")
    if body is not None:
        return httpx.Response(status, json=body, request=req)
    return httpx.Response(status, text=text or "", request=req)


def test_error_messages():
    e = error_message(resp(403, {"code": "PRIORITY_NOT_ALLOWED",
                                 "message": "priority 60 is above namespace ws-3f9c2a1b7d4e's maximum of 0"}))
    assert e.message == "403 PRIORITY_NOT_ALLOWED: priority 60 is above namespace ws-3f9c2a1b7d4e's maximum of 0"
    assert e.status == 403 and e.code == "PRIORITY_NOT_ALLOWED"
    assert error_message(resp(404, {"detail": "Not Found"})).message == "404 Not Found: Not Found"
    assert error_message(resp(422, {"detail": [{"loc": ["body", "spec", "x"], "msg": "bad"}]})).message == \
        "422 Unprocessable Entity: spec.x: bad"
    assert error_message(resp(502, text="<html>\nbad gateway")).message == "502 Bad Gateway: <html>"
    assert "astra login" in error_message(resp(401, {"code": "UNAUTHENTICATED", "message": "no"})).message


def test_connection_refused_is_one_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    api = f"http://127.0.0.1:{port}/api/v1/o/a/w/b"
    with Client(Config(api, "t")) as c, pytest.raises(ApiError) as e:
        c.get("runs")
    assert e.value.message.startswith(f"cannot reach the Astraeus API at {api}: ")
