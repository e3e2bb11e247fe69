"""`astra astraeus pools` and `astra astraeus reservations` (issue 18): the workspace's tables, and the organisation
admin's create/delete through $ORG_API (the workspace API URL without /w/WS, with ASTRAEUS_ADMIN_TOKEN); `machines`
shows each machine's pools; bad input is one line naming the field. A subprocess against a real local cluster (one
machine gpu-01 with 8 simulated GPUs)."""

from __future__ import annotations

import pytest

from astraeus.cli.client import ApiError, org_config
from tests.cli.test_commands import astra, ok, one_line_error


@pytest.fixture
def c(shared_cluster):
    return shared_cluster


def test_org_api_is_the_workspace_api_without_its_workspace():
    env = {"ASTRAEUS_API": "http://cp1:8420/api/v1/o/acme/w/vision,http://cp2:8420", "ASTRAEUS_TOKEN": "t",
           "ASTRAEUS_CONFIG": "/nonexistent/config.json"}
    assert org_config(env).api == "http://cp1:8420/api/v1/o/acme,http://cp2:8420/api/v1/o/acme"
    assert org_config(env).token == "t"
    assert org_config({**env, "ASTRAEUS_ADMIN_TOKEN": "admin"}).token == "admin"
    with pytest.raises(ApiError, match="is not a workspace's"):
        org_config({**env, "ASTRAEUS_API": "http://cp1:8420/api/v1"})


def test_pools_from_create_to_delete(c):
    out = ok(astra(c, "astraeus", "pools", "create", "fast", "--cluster", "main", "--machine", "gpu-01"))
    assert out.strip() == "pool fast created in cluster main: 1 machine(s) (gpu-01)"
    lines = ok(astra(c, "astraeus", "pools")).splitlines()
    assert lines[0].split() == ["NAME", "CLUSTER", "MACHINES", "GPUS", "FREE", "GPUS"]
    row = next(li for li in lines if li.startswith("fast "))
    assert row.split()[:4] == ["fast", "main", "gpu-01", "8"]
    assert ok(astra(c, "astraeus", "pools", "list")) == "\n".join(lines) + "\n"
    machines = ok(astra(c, "astraeus", "machines")).splitlines()
    assert machines[0].split()[:4] == ["NAME", "CLUSTER", "STATE", "POOLS"]
    assert machines[1].split()[3] == "fast"
    # errors: one line naming the field
    err = one_line_error(astra(c, "astraeus", "pools", "create", "fast", "--cluster", "main", "--machine", "gpu-01"))
    assert "409 ALREADY_EXISTS" in err
    err = one_line_error(astra(c, "astraeus", "pools", "create", "x", "--cluster", "main", "--machine", "nosuch"))
    assert "machines: no machine named nosuch in cluster main" in err
    err = one_line_error(astra(c, "astraeus", "pools", "create", "x", "--cluster", "main", "--label", "novalue"))
    assert err == "error: --label novalue: give KEY=VALUE, e.g. --label gpu=a100"
    err = one_line_error(astra(c, "astraeus", "pools", "create", "x", "--cluster", "main"))
    assert "give the pool's machines (--machine NAME) or labels (--label KEY=VALUE)" in err
    assert ok(astra(c, "astraeus", "pools", "delete", "fast", "--cluster", "main")).strip() == "pool fast deleted"
    assert "fast" not in ok(astra(c, "astraeus", "pools"))


def test_reservations_from_create_to_delete(c):
    ok(astra(c, "astraeus", "pools", "create", "resv", "--cluster", "main", "--label", "nosuch=label"))
    out = ok(astra(c, "astraeus", "reservations", "create", "launch", "--cluster", "main", "--workspace", "vision",
                   "--machine", "gpu-01", "--start", "2099-12-01T10:00:00Z", "--end", "2099-12-01T18:00:00Z"))
    assert out.strip() == ("reservation launch created: gpu-01 for vision from 2099-12-01 10:00:00 UTC to "
                           "2099-12-01 18:00:00 UTC (Scheduled)")
    lines = ok(astra(c, "astraeus", "reservations")).splitlines()
    assert lines[0].split() == ["NAME", "CLUSTER", "MACHINES", "START", "END", "STATE"]
    assert lines[1].split() == ["launch", "main", "gpu-01", "2099-12-01", "10:00:00", "UTC", "2099-12-01",
                                "18:00:00", "UTC", "Scheduled"]
    assert "launch" in ok(astra(c, "astraeus", "reservations", "list", "--all"))
    # errors name the field, as the API does
    for args, says in [
        (["--machine", "gpu-01", "--start", "2099-12-01T12:00:00Z"], "409 RESERVATION_CONFLICT: machine gpu-01 is "
                                                                     "already reserved by launch"),
        (["--machine", "gpu-01", "--start", "2099-12-02T10:00:00Z", "--end", "2099-12-02T09:00:00Z"],
         "end: must be after start"),
        (["--machine", "nosuch"], "machines: no machine named nosuch in cluster main"),
        (["--pool", "nosuch", "--count", "1"], "pool: no pool named nosuch in cluster main"),
        (["--pool", "resv", "--count", "3"], "count: pool resv has 0 machines, 3 asked"),
    ]:
        err = one_line_error(astra(c, "astraeus", "reservations", "create", "other", "--cluster", "main",
                                   "--workspace", "vision", *args))
        assert says in err, (args, err)
    err = one_line_error(astra(c, "astraeus", "reservations", "create", "other", "--cluster", "main",
                               "--workspace", "nosuch", "--machine", "gpu-01", "--start", "2099-01-01T00:00:00Z",
                               "--end", "2099-01-02T00:00:00Z"))
    assert "workspaces: no workspace named nosuch" in err
    err = one_line_error(astra(c, "astraeus", "reservations", "create", "other", "--cluster", "main",
                               "--workspace", "vision"))
    assert err == "error: give machines (--machine NAME, repeatable), or a pool and a count (--pool P --count N)"
    err = one_line_error(astra(c, "astraeus", "reservations", "create", "other", "--cluster", "main",
                               "--workspace", "vision", "--machine", "gpu-01", "--pool", "resv", "--count", "1"))
    assert err == "error: give machines (--machine), or a pool and a count (--pool P --count N), not both"
    assert ok(astra(c, "astraeus", "reservations", "delete", "launch")).strip() == "reservation launch ended"
    row = next(li for li in ok(astra(c, "astraeus", "reservations")).splitlines() if li.startswith("launch "))
    assert row.split()[-1] == "Ended"
    ok(astra(c, "astraeus", "pools", "delete", "resv", "--cluster", "main"))


def test_sbatch_reaches_pools_and_reservations(c, tmp_path):
    ok(astra(c, "astraeus", "pools", "create", "sb", "--cluster", "main", "--machine", "gpu-01"))
    script = tmp_path / "p.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --container-image=python:3.11\n#SBATCH -J in-pool\nsleep 1\n")
    r = astra(c, "slurm", "sbatch", "--test-only", "-p", "sb", "--gres=gpu:1", str(script))
    assert r.returncode == 0 and r.stderr.strip().endswith(" on nodes gpu-01 in partition sb"), r.stderr
    r = astra(c, "slurm", "sbatch", "--test-only", "-p", "nosuch", str(script))
    assert r.returncode == 1 and "node_selection.pools: no pool named nosuch in cluster main" in r.stderr, r.stderr
    assert r.stderr.strip().endswith("(-p/--partition names pools: astra astraeus pools; give a cluster with "
                                     "-M/--clusters=NAME)"), r.stderr
    r = astra(c, "slurm", "sbatch", "--test-only", "-M", "main", "--gres=gpu:1", str(script))
    assert r.returncode == 0 and r.stderr.strip().endswith(" on nodes gpu-01 in partition main"), r.stderr
    r = astra(c, "slurm", "sbatch", "--test-only", "--reservation=nosuch", str(script))
    assert r.returncode == 1 and "node_selection.reservation: no reservation named nosuch" in r.stderr, r.stderr
    ok(astra(c, "astraeus", "pools", "delete", "sb", "--cluster", "main"))
