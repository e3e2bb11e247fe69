"""`astra astraeus users` and `astra astraeus audit` against a real local cluster (docs/users.md): alice's run
shows alice in `runs -o wide`, `squeue` and `describe`; bob's delete and carol's refused one are in the audit log;
a bad role is one clear line and exit 1."""

from __future__ import annotations

from tests.cli.test_commands import astra, ok, one_line_error


def column(out: str, name: str, row: str) -> str:
    lines = out.splitlines()
    header = lines[0].split()
    line = next(line for line in lines[1:] if row in line.split())
    return line.split()[header.index(name)]


def test_users_their_runs_and_the_audit_log(cluster):
    ws = cluster.api.rsplit("/w/", 1)[1]
    for name, role in (("alice", "editor"), ("bob", "editor"), ("carol", "viewer")):
        assert "alice" in ok(astra(cluster, "astraeus", "users", "create", name, "--role", f"{ws}={role}")) \
            or name != "alice"
    tokens = {n: ok(astra(cluster, "astraeus", "users", "token", n, "--workspace", ws)).strip()
              for n in ("alice", "bob", "carol")}
    as_ = {n: {"ASTRAEUS_TOKEN": t} for n, t in tokens.items()}
    ok(astra(cluster, "astraeus", "run", "--name", "hello", "--image", "python:3.11", "--", "sleep", "300",
             env=as_["alice"]))
    assert column(ok(astra(cluster, "astraeus", "runs", "-o", "wide")), "USER", "hello") == "alice"
    assert column(ok(astra(cluster, "slurm", "squeue")), "USER", "hello") == "alice"
    assert "Created by:" in ok(astra(cluster, "astraeus", "describe", "hello"))
    assert [line for line in ok(astra(cluster, "astraeus", "describe", "hello")).splitlines()
            if line.startswith("Created by:")][0].split()[-1] == "alice"

    assert astra(cluster, "astraeus", "delete", "hello", env=as_["carol"]).returncode == 1
    ok(astra(cluster, "astraeus", "delete", "hello", env=as_["bob"]))
    out = ok(astra(cluster, "astraeus", "audit", "--since", "1h"))
    rows = [line.split() for line in out.splitlines()[1:]]
    assert ["bob", ws, "delete", "runs/hello", "200"] in [r[1:6] for r in rows]
    assert ["carol", ws, "delete", "runs/hello", "403", "refused"] in [r[1:7] for r in rows]
    assert all(tokens["alice"] not in line for line in out.splitlines())
    events = ok(astra(cluster, "astraeus", "events"))
    assert "Deleted by bob" in events

    err = one_line_error(astra(cluster, "astraeus", "users", "create", "dave", "--role", f"{ws}=owner"))
    assert "unknown role 'owner': give viewer, editor or admin" in err
    assert "dave" not in ok(astra(cluster, "astraeus", "users"))
