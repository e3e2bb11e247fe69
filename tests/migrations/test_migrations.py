"""Migrations: head matches the models exactly (autogenerate finds no difference), 0001 is the schema as first
released, and databases written by released code start under this code with every object intact, on SQLite
and PostgreSQL.

The fixtures in fixtures/ were made by released commits of this repository (tests/migrations/make_fixture.py;
see fixtures/README.md): `release_5a64dc1` by the first release (stamped 0001, already with workers.deadline,
because its 0001 ran create_all on the models of the day), `before_0eafa08` by the code before workers.deadline
existed (stamped 0001 without it). Each .json holds what that code's own API showed for every object.
"""

from __future__ import annotations

import ast
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import astraeus.server.migrations as migrations
from astraeus.server import db
from astraeus.server.core import ControlPlane
from astraeus.settings import ServerSettings
from tests.conftest import drop_postgres, make_app, postgres_url

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCRIPTS = Path(migrations.__file__).resolve().parent
RELEASES = ["release_5a64dc1", "before_0eafa08"]
DIALECTS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


# ------------------------------------------------------------------------------------------------ helpers


@pytest.fixture(params=DIALECTS)
def empty_db(request, tmp_path):
    """The URL of a fresh, empty database: a SQLite file, or a throwaway PostgreSQL database dropped after."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    url = postgres_url()
    yield url
    drop_postgres(url)


def alembic(url: str, action, revision: str) -> None:
    """`alembic <action> <revision>` on the database at `url`, through the control plane's migration env."""
    engine = db.make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        action(cfg, revision)
    engine.dispose()


def differences(url: str) -> list:
    """What autogenerate would write into a new revision: the models against the database at `url`."""
    engine = db.make_engine(url)
    with engine.connect() as conn:
        mc = MigrationContext.configure(conn, opts=dict(migrations.CONTEXT_OPTIONS))
        diff = compare_metadata(mc, db.Base.metadata)
    engine.dispose()
    return diff


def version(url: str) -> str:
    engine = db.make_engine(url)
    with engine.connect() as conn:
        v = MigrationContext.configure(conn).get_current_revision()
    engine.dispose()
    return v


def user_tables(url: str) -> set[str]:
    engine = db.make_engine(url)
    names = set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    engine.dispose()
    return names


def head() -> str:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    return ScriptDirectory.from_config(cfg).get_current_head()


def pg_schema(url: str) -> dict:
    """PostgreSQL's own account of a schema: every column (position, type, nullability, default), every
    constraint by name with its definition, every index by name with its definition, every sequence."""
    engine = db.make_engine(url)
    with engine.connect() as conn:
        q = lambda sql: sorted(tuple(r) for r in conn.exec_driver_sql(sql))  # noqa: E731
        out = {
            "columns": q("""SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                                   pg_get_expr(d.adbin, d.adrelid)
                            FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                            JOIN pg_namespace n ON n.oid = c.relnamespace
                            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                            WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0
                              AND NOT a.attisdropped AND c.relname <> 'alembic_version'"""),
            "constraints": q("""SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
                                FROM pg_constraint WHERE connamespace = 'public'::regnamespace
                                  AND conrelid::regclass::text <> 'alembic_version'"""),
            "indexes": q("""SELECT tablename, indexname, indexdef FROM pg_indexes
                            WHERE schemaname = 'public' AND tablename <> 'alembic_version'"""),
            "sequences": q("""SELECT sequence_name, data_type FROM information_schema.sequences
                              WHERE sequence_schema = 'public'"""),
        }
    engine.dispose()
    return out


def sqlite_schema(path: Path) -> dict[str, str]:
    """SQLite's stored CREATE statement of every table and index, by name."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)  # never writes (a fixture stays as made)
    rows = con.execute("SELECT name, sql FROM sqlite_master WHERE name <> 'alembic_version' AND sql IS NOT NULL")
    out = dict(rows.fetchall())
    con.close()
    return out


def rows(url: str) -> dict[str, dict[int, dict]]:
    """Every row of every table, by table and id, read through reflected types (JSON parsed, booleans bool)."""
    engine = sa.create_engine(url if not url.startswith("postgresql://") else "postgresql+psycopg" + url[10:])
    md = sa.MetaData()
    md.reflect(engine)
    out = {}
    with engine.connect() as conn:
        for t in md.sorted_tables:
            if t.name != "alembic_version":
                out[t.name] = {r["id"]: dict(r) for r in conn.execute(sa.select(t)).mappings()}
    engine.dispose()
    return out


def load_into_postgres(release: str, url: str) -> None:
    """What the released code left on PostgreSQL: its models' DDL (as its create_all emitted it), stamped
    0001, holding the fixture's rows (the same data as its SQLite database) with the sequences past them."""
    ddl = json.loads((FIXTURES / f"{release}.ddl.json").read_text())["postgresql"]
    engine = db.make_engine(url)
    with engine.begin() as conn:
        for stmt in ddl:
            conn.exec_driver_sql(stmt)
    alembic(url, command.stamp, "0001")
    source = rows(f"sqlite:///file:{FIXTURES / f'{release}.db'}?mode=ro&uri=true")
    md = sa.MetaData()
    md.reflect(engine)
    with engine.begin() as conn:
        for t in md.sorted_tables:
            if t.name in source and source[t.name]:
                conn.execute(t.insert(), list(source[t.name].values()))
                conn.exec_driver_sql(f"SELECT setval(pg_get_serial_sequence('{t.name}', 'id'), "
                                     f"(SELECT max(id) FROM {t.name}))")
    engine.dispose()


# --------------------------------------------------------------------------------------- the schema itself


def test_revisions_are_explicit_and_never_built_from_the_models():
    """A revision that imported the models would change whenever they do: the bug revision 0001 had."""
    for f in sorted((SCRIPTS / "versions").glob("*.py")):
        tree = ast.parse(f.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imported <= {"sqlalchemy", "alembic"}, (f.name, imported)
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not used & {"create_all", "drop_all", "metadata"}, f.name
    # One line of revisions, numbered in order: the newest file is the head.
    assert head() == max(f.name.split("_")[0] for f in (SCRIPTS / "versions").glob("0*.py"))


def test_autogenerate_against_head_finds_no_difference(empty_db):
    alembic(empty_db, command.upgrade, "head")
    assert version(empty_db) == head()
    assert differences(empty_db) == []


def test_0001_is_the_first_release_schema_on_sqlite(tmp_path):
    """Revision 0001 creates, statement for statement, what the code before 0eafa08 created on SQLite."""
    fresh = tmp_path / "fresh.db"
    alembic(f"sqlite:///{fresh}", command.upgrade, "0001")
    old = sqlite_schema(FIXTURES / "before_0eafa08.db")
    assert sqlite_schema(fresh) == old
    assert "deadline" not in old["workers"] and "ix_workers_deadline" not in old


@pytest.mark.postgres
def test_0001_is_the_first_release_schema_on_postgresql():
    """Revision 0001 creates what the code before 0eafa08 created on PostgreSQL, down to the names PostgreSQL
    gave the constraints (runs_uid_key, workers_run_id_fkey, ...): columns, types, constraints, indexes."""
    ours, theirs = postgres_url(), postgres_url()
    try:
        alembic(ours, command.upgrade, "0001")
        engine = db.make_engine(theirs)
        with engine.begin() as conn:
            for stmt in json.loads((FIXTURES / "before_0eafa08.ddl.json").read_text())["postgresql"]:
                conn.exec_driver_sql(stmt)
        engine.dispose()
        mine, old = pg_schema(ours), pg_schema(theirs)
        assert mine == old
        assert ("runs", "runs_uid_key", "u", "UNIQUE (uid)") in old["constraints"]
    finally:
        drop_postgres(ours)
        drop_postgres(theirs)


def test_downgrade_to_base_and_up_again(empty_db):
    alembic(empty_db, command.upgrade, "head")
    alembic(empty_db, command.downgrade, "base")
    assert user_tables(empty_db) == set()
    assert version(empty_db) is None
    alembic(empty_db, command.upgrade, "head")
    assert differences(empty_db) == []


def table_options(url: str) -> dict[str, list[str]]:
    """PostgreSQL's storage parameters of each table that has any ({"runs": ["fillfactor=70"], ...})."""
    engine = db.make_engine(url)
    with engine.connect() as conn:
        got = {t: sorted(o) for t, o in conn.exec_driver_sql(
            "SELECT relname, reloptions FROM pg_class WHERE relkind = 'r' AND reloptions IS NOT NULL "
            "AND relnamespace = 'public'::regnamespace")}
    engine.dispose()
    return got


@pytest.mark.postgres
def test_runs_and_workers_keep_room_for_hot_updates_as_the_models_say():
    """Revision 0012: fillfactor 70 on runs and workers (autogenerate does not compare storage parameters, so this
    test does); the models' create_all makes the same; down to 0011 takes it off again."""
    url, made = postgres_url(), postgres_url()
    try:
        alembic(url, command.upgrade, "head")
        models = {t.name: sorted(f"{k}={v}" for k, v in t.dialect_options["postgresql"]["with"].items())
                  for t in db.Base.metadata.sorted_tables if t.dialect_options["postgresql"]["with"]}
        assert models == {"runs": ["fillfactor=70"], "workers": ["fillfactor=70"]}
        assert table_options(url) == models
        engine = db.make_engine(made)
        db.Base.metadata.create_all(engine)
        engine.dispose()
        assert table_options(made) == models
        alembic(url, command.downgrade, "0011")
        assert table_options(url) == {}
    finally:
        drop_postgres(url)
        drop_postgres(made)


# ------------------------------------------------------------------------ databases of released code


@pytest.fixture(params=[(r, d) for r in RELEASES for d in DIALECTS],
                ids=[f"{r}-{d if isinstance(d, str) else d.values[0]}" for r in RELEASES for d in DIALECTS])
def released(request, tmp_path):
    """(release, url, rows before the upgrade): a database as that released code left it, not yet opened by
    this code. SQLite: a copy of its file. PostgreSQL: its DDL and the same rows, in a throwaway database."""
    release, dialect = request.param[0], request.param[1]
    dialect = dialect if isinstance(dialect, str) else dialect.values[0]
    if dialect == "sqlite":
        home = tmp_path / "home"
        home.mkdir()
        shutil.copyfile(FIXTURES / f"{release}.db", home / "astraeus.db")
        url = None
        before = rows(f"sqlite:///{home / 'astraeus.db'}")
        yield release, url, before
        return
    url = postgres_url()
    try:
        load_into_postgres(release, url)
        yield release, url, rows(url)
    finally:
        drop_postgres(url)


def test_released_database_upgrades_to_head(released, tmp_path):
    release, url, before = released
    facts = json.loads((FIXTURES / f"{release}.json").read_text())
    url_now = url or f"sqlite:///{tmp_path / 'home' / 'astraeus.db'}"
    assert version(url_now) == "0001"
    had_deadline = "deadline" in next(iter(before["workers"].values()))
    assert had_deadline == (release == "release_5a64dc1")

    # The start-up opens the database, which migrates it to head.
    cp = ControlPlane.open(ServerSettings(home=tmp_path / "home", database_url=url))
    cp.engine.dispose()
    assert version(url_now) == head()
    assert differences(url_now) == []

    # Every row of every table is still there, every value unchanged; the new columns hold their defaults.
    after = rows(url_now)
    for table, old_rows in before.items():
        for id_, old in old_rows.items():
            new = after[table].get(id_)
            assert new is not None, f"{table} {id_} lost"
            assert {k: new[k] for k in old} == old, f"{table} {id_} changed"
    for w in after["workers"].values():
        assert w["restart_at"] is None and w["crash_streak"] == 0
        if not had_deadline:
            assert w["deadline"] is None
    if had_deadline:
        assert any(w["deadline"] for w in after["workers"].values())

    # And the control plane serves it: the API shows every object as the released code's API did.
    client, _boot, cp, _ = make_app(tmp_path, url, run_loop=False)
    try:
        with client:
            check_api(client, facts)
    finally:
        cp.engine.dispose()


def check_api(client, facts: dict) -> None:
    """What the new code's API shows for every object equals what the released code's API showed."""
    shown, api, org = facts["shown"], facts["api"], facts["org_api"]
    tokens = facts["tokens"]
    h = {"Authorization": f"Bearer {tokens['editor']}"}
    ha = {"Authorization": f"Bearer {tokens['admin']}"}

    def get(path, headers=h, **params):
        r = client.get(path, headers=headers, params=params)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r

    # Runs: the list, and each run's detail with its workers and history.
    runs = {r["metadata"]["name"]: r for r in get(api + "/runs").json()["items"]}
    assert set(runs) == {r["metadata"]["name"] for r in shown["runs"]}
    for name, old in shown["run"].items():
        new = get(f"{api}/runs/{name}").json()
        assert new["metadata"]["name"] == name
        for k in ("uid", "labels", "workspace", "namespace", "cluster", "created_at"):
            assert new["metadata"][k] == old["metadata"][k], (name, k)
        assert new["spec"]["task_template"]["args"] == old["spec"]["task_template"]["args"]
        assert new["spec"]["priority"] == old["spec"]["priority"]
        for k in ("state", "started_at", "finished_at", "restarts", "preemptions", "history"):
            assert new["status"][k] == old["status"][k], (name, k)
        if old["status"]["state"] != "Pending":  # a waiting run's reason is the scheduler's, recomputed
            assert new["status"]["reason"] == old["status"]["reason"], name
        assert [w["name"] for w in new["status"]["workers"]] == [w["name"] for w in old["status"]["workers"]]

    # Workers and their log lines.
    workers = {w["name"]: w for w in get(api + "/workers").json()["items"]}
    assert set(workers) == {w["name"] for w in shown["workers"]}
    for old in shown["workers"]:
        new = workers[old["name"]]
        for k in ("run", "index", "state", "restarts", "preemptions", "exit_code", "machine", "attempt",
                  "gpu_indices", "environment", "placed_at", "started_at", "finished_at"):
            assert new[k] == old[k], (old["name"], k)
        if old["state"] != "Pending":
            assert new["reason"] == old["reason"], old["name"]
    assert any(text for text in shown["logs"].values())
    for name, text in shown["logs"].items():
        assert get(f"{api}/workers/{name}/logs").text == text, name

    # Drives, machines, events.
    drives = {d["metadata"]["name"]: d for d in get(api + "/drives").json()["items"]}
    assert {n: d["spec"] for n, d in drives.items()} == {d["metadata"]["name"]: d["spec"] for d in shown["drives"]}
    machines = {m["name"]: m for m in get(api + "/machines").json()["items"]}
    for old in shown["machines"]:
        for k in ("cluster", "gpus", "gpu_models", "cpu_cores", "memory_bytes", "labels", "stop_grace_seconds"):
            assert machines[old["name"]][k] == old[k], (old["name"], k)
    events = get(api + "/events", limit=1000).json()["items"]
    seen = {(e["time"], e["kind"], e["object"], e["message"]) for e in events}
    assert shown["events"] and all((e["time"], e["kind"], e["object"], e["message"]) in seen
                                   for e in shown["events"])

    # Workspaces, their access to the cluster, and the tokens.
    spaces = {w["name"]: w for w in get(org + "/workspaces", ha).json()["items"]}
    for old in shown["workspaces"]:
        new = spaces[old["name"]]
        assert new["id"] == old["id"]
        for k in ("max_priority", "weight", "quota"):
            assert new["clusters"]["main"][k] == old["clusters"]["main"][k], (old["name"], k)
        # (the start-up's bootstrap grants the default host path too, as `astraeus server` does on any start)
        assert set(old["clusters"]["main"]["host_paths"]) <= set(new["clusters"]["main"]["host_paths"])
    listed = {t["id"]: t for t in get(org + "/tokens", ha).json()["items"]}
    for old in shown["tokens"]:
        assert {k: listed[old["id"]][k] for k in ("kind", "role", "revoked")} == \
               {k: old[k] for k in ("kind", "role", "revoked")}

    # The old tokens still authenticate, with their roles; the revoked one does not.
    viewer = {"Authorization": f"Bearer {tokens['viewer']}"}
    assert get(api + "/runs", viewer).json()["items"]
    assert client.post(api + "/runs", headers=viewer, json=run_body("by-viewer")).status_code == 403
    assert client.get(api + "/runs", headers={"Authorization": f"Bearer {tokens['revoked']}"}).status_code == 401
    r = client.get(api + "/runs", headers={"Authorization": f"Bearer {tokens['machine']}"})
    assert r.status_code == 403, r.text  # known, and a machine's: not a user endpoint

    # And the new code writes to it: a deleted run's name is free again, a live one's is not.
    assert "gone" not in runs
    r = client.post(api + "/runs", headers=h, json=run_body("gone"))
    assert r.status_code == 201, r.text
    assert client.post(api + "/runs", headers=h, json=run_body("hello")).status_code == 409


def run_body(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {"image": "python:3.11", "command": "true"}}}


def test_a_database_from_before_0eafa08_gains_the_deadline_column(tmp_path):
    """Stamped 0001 but made before workers.deadline existed: the upgrade adds the column and its index, and
    the time-limit code that reads them works."""
    path = tmp_path / "old.db"
    shutil.copyfile(FIXTURES / "before_0eafa08.db", path)
    url = f"sqlite:///{path}"
    engine = db.make_engine(url)
    assert "deadline" not in {c["name"] for c in sa.inspect(engine).get_columns("workers")}
    db.migrate(engine)
    insp = sa.inspect(engine)
    assert "deadline" in {c["name"] for c in insp.get_columns("workers")}
    assert "ix_workers_deadline" in {ix["name"] for ix in insp.get_indexes("workers")}
    with db.session_factory(engine)() as s:
        assert s.scalars(sa.select(db.Worker).where(db.Worker.deadline.is_(None))).all()
    engine.dispose()


def test_0002_is_a_no_op_where_the_release_already_added_the_column(tmp_path):
    path = tmp_path / "release.db"
    shutil.copyfile(FIXTURES / "release_5a64dc1.db", path)
    url = f"sqlite:///{path}"
    schema = sqlite_schema(path)
    alembic(url, command.upgrade, "0002")
    assert sqlite_schema(path) == schema
    assert version(url) == "0002"


# Columns that revisions after 0001 add, with the value an existing row gets.
ADDED_SINCE_0001 = {"workers": {"restart_at": None, "crash_streak": 0, "rendezvous": None,
                                "progress_at": None, "progress_text": None, "checkpoint_at": None, "stalled_at": None,
                                "gpu_milli": 0, "mig_devices": None},
                    "clusters": {"preemption_victims": "recent", "gpu_sharing": "workspace",
                                 "placement": "bestfit"},
                    "tokens": {"machine_id": None},
                    "runs": {"template": None, "template_version": None, "schedule_id": None, "group_id": None,
                             "array_job": None, "array_index": None, "array_max_running": None,
                             "held": False},
                    "machines": {"runtime": None, "address": None, "shared_filesystems": None, "nfs": None,
                                 "disk_path": None, "disk_free_bytes": None, "disk_total_bytes": None,
                                 "cordon": None, "cordon_reason": None, "cordon_by": None, "cordon_at": None,
                                 "gpu_faults": None, "gpu_memory": None, "gpu_mig": None,
                                 "nvlink_islands": None},
                    "access": {"pools": None, "host_network": False, "default_image": None,
                               "max_gpus_per_user": None},
                    "users": {"sso_subject": None}}
for _table in ("runs", "drives", "templates", "schedules", "replica_groups", "reservations"):  # revision 0018
    ADDED_SINCE_0001[_table] = {**ADDED_SINCE_0001.get(_table, {}), "created_by": None, "updated_by": None}
# Revision 0018 gives each existing user or org admin token an owner (a service account, or the user `admin`).
OWNED_SINCE_0018 = {"tokens": {"user_id": lambda v, old: (v is not None) == (old["kind"] != "machine")}}


def test_downgrade_to_0001_keeps_every_row(released, tmp_path):
    """Down to the first release's schema and up again, on a database with rows: nothing but the later
    revisions' columns goes (SQLite drops the columns in place; a copy of `workers` would break log_lines')."""
    _release, url, before = released
    url = url or f"sqlite:///{tmp_path / 'home' / 'astraeus.db'}"
    alembic(url, command.upgrade, "head")
    alembic(url, command.downgrade, "0001")
    down = rows(url)
    assert {c for w in down["workers"].values() for c in w} & {"deadline", "restart_at", "crash_streak"} == set()
    alembic(url, command.upgrade, "head")
    assert differences(url) == []
    up = rows(url)
    for table, old_rows in before.items():
        assert set(up[table]) == set(old_rows), table
        owned = OWNED_SINCE_0018.get(table, {})
        for id_, old in old_rows.items():
            assert all(check(up[table][id_][k], old) for k, check in owned.items()), (table, id_)
            assert {k: v for k, v in up[table][id_].items() if k != "deadline" and k not in owned} == \
                   {k: v for k, v in old.items() if k != "deadline"} | ADDED_SINCE_0001.get(table, {}), (table, id_)
