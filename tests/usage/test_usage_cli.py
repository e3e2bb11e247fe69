"""The usage table and sreport's layouts from a usage answer (pure: astraeus.cli.usage); on a live cluster:
test_usage_live.py."""

from datetime import UTC, datetime, timedelta

import pytest

from astraeus.cli import usage as cu
from astraeus.cli.errors import ViewError


def row(ws, user, seconds, cluster="main"):
    return {"cluster": cluster, "workspace": ws, "user": user, "gpu_hours": seconds / 3600, "gpu_seconds": seconds,
            "cpu_core_hours": 0, "attempts": 1, "preemptions": 0, "queue_wait_seconds": 0}


DATA = {"since": "2030-01-01T00:00:00Z", "until": "2030-01-02T00:00:00Z", "group_by": ["cluster", "workspace", "user"],
        "items": [row("nlp", "bob", 600), row("vision", "alice", 7260), row("vision", None, 90)],
        "total": {**row("", "", 7950)}}


def test_account_utilization_by_user_is_root_then_each_account_and_its_logins():
    assert cu.account_by_user(DATA, 60) == [
        ["main", "root", "", "", "gres/gpu", "132"],
        ["main", "nlp", "", "", "gres/gpu", "10"], ["main", "nlp", "bob", "", "gres/gpu", "10"],
        ["main", "vision", "", "", "gres/gpu", "122"], ["main", "vision", "alice", "", "gres/gpu", "121"],
        ["main", "vision", "vision", "", "gres/gpu", "1"]]  # a run without a user: the workspace is the login


def test_top_usage_is_most_used_first_and_cut_at_top_count():
    assert cu.top_usage(DATA, 3600, 2) == [["main", "alice", "", "vision", "gres/gpu", "2"],
                                            ["main", "bob", "", "nlp", "gres/gpu", "0"]]


def test_print_fields_layouts():
    headers = ["Cluster", "Login", "Used"]
    rows = [["main", "alice", "121"]]
    assert cu.sreport_lines(headers, rows, None, True) == [
        "  Cluster     Login       Used ", "--------- --------- ---------- ", "     main     alice        121 "]
    assert cu.sreport_lines(headers, rows, "P", True) == ["Cluster|Login|Used", "main|alice|121"]
    assert cu.sreport_lines(headers, rows, "p", False) == ["main|alice|121|"]


def test_the_usage_table_has_a_total_line():
    lines = cu.usage_table({**DATA, "group_by": ["user"], "items": [
        {k: v for k, v in r.items() if k not in ("cluster", "workspace")} for r in DATA["items"]]}).splitlines()
    assert lines[0] == "Usage 2030-01-01T00:00:00Z - 2030-01-02T00:00:00Z"
    assert lines[1].split() == ["USER", "GPU-HOURS", "ATTEMPTS", "PREEMPTED", "QUEUE", "WAIT"]
    assert [ln.split()[:2] for ln in lines[2:]] == [["bob", "0.17"], ["alice", "2.02"], ["-", "0.03"],
                                                    ["TOTAL", "2.21"]]


def test_report_words_and_window():
    assert cu.parse_words(["Cluster", "accountutilizationbyuser", "Start=2030-01-01"]) == (
        "AccountUtilizationByUser", {"start": "2030-01-01"})
    for words, says in ((["cluster"], "unknown report 'cluster'"), (["user", "TopUsage", "Users=bob"],
                                                                    "unknown option users=")):
        with pytest.raises(ViewError, match=says):
            cu.parse_words(words)
    now = datetime(2030, 1, 5, 15, 30, tzinfo=UTC)
    assert cu.sreport_window(None, None, now) == (datetime(2030, 1, 4, tzinfo=UTC),
                                                  datetime(2030, 1, 5, tzinfo=UTC))
    assert cu.sreport_window("now-2hours", None, now) == (now - timedelta(hours=2), now)
    with pytest.raises(ViewError, match="start=2030-01-06 is not before end=today"):
        cu.sreport_window("2030-01-06", None, now)
