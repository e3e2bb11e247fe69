"""server/lifecycle.py is the only code that writes a state, a stop kind, a reason, a restart or preemption
count, or a crash-loop backoff. This reads every module of src/astraeus (its syntax tree, not its text, so a
tuple assignment, an augmented one or a keyword of a row's constructor is found too) and fails on any write
of those fields elsewhere, and on any History line or Event written elsewhere: made as a row, inserted by its
model or table, or as dicts given to `values`, `execute` and the like.

The scheduler, the simulator and the CLI are left out: their objects are frozen dataclasses, the simulator's own
records and the API's answers, never database rows; a test below makes sure they never import the server or SQLAlchemy, so no row
can reach them."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "astraeus"
WRITER = SRC / "server" / "lifecycle.py"
NO_ROWS = ("scheduler", "sim", "cli")  # packages that never hold a database row (checked below)
WATCHED = {"state", "stop_kind", "stop_reason", "reason", "queue_reason", "restarts", "preemptions",
           "preempted_by", "crash_streak", "restart_at", "desired"}
ROWS = {"Run", "Worker", "Machine"}
RECORDS = {"History", "Event"}  # a run's History and its workspace's Events: written by lifecycle only
# Rows written in bulk as dicts: the dict literals (and dict(...) calls) given to these calls are checked too.
BULK = {"values", "execute", "executemany", "insert", "update"}
# (module, function) -> what it may write besides lifecycle (nothing at present).
ALLOWED: dict[tuple[str, str], set[str]] = {}
# setattr with a computed name, where the object is known not to be a row that has a watched field:
# (module, function) -> the model it writes, checked below to have no watched column.
COMPUTED_SETATTR = {("server/services/bootstrap.py", "set_access"): "Access",
                    ("server/services/sso.py", "set_config"): "SsoProvider",
                    ("server/admin.py", "_set_policies"): "Cluster"}


def writes(source: str, module: str = "") -> list[tuple[int, str]]:
    """(line, what) for each write of a watched field in `source`."""
    found = []
    tree = ast.parse(source)
    records = imported_records(tree) if module else set(RECORDS)
    owner = {}  # node -> name of the function it is in
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                if n is not fn:
                    owner.setdefault(n, fn.name)  # the outermost function: ast.walk goes breadth first

    def targets(t):
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                yield from targets(e)
        elif isinstance(t, ast.Starred):
            yield from targets(t.value)
        else:
            yield t

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            tgts = [x for t in node.targets for x in targets(t)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            tgts = list(targets(node.target))
        else:
            tgts = []
        for t in tgts:
            if isinstance(t, ast.Attribute) and t.attr in WATCHED:
                found.append((node.lineno, f"assignment to .{t.attr}"))
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == "setattr" and len(node.args) >= 2:
                a = node.args[1]
                computed = not isinstance(a, ast.Constant)
                if computed and (module, owner.get(node)) in COMPUTED_SETATTR:
                    continue
                if computed or a.value in WATCHED:
                    found.append((node.lineno, "setattr of " + (repr(a.value) if isinstance(a, ast.Constant)
                                                                else "a computed name")))
            if name in ROWS | {"values", "update", "insert"}:
                for k in node.keywords:
                    if k.arg in WATCHED:
                        found.append((node.lineno, f"{name}({k.arg}=...)"))
            if isinstance(f, ast.Name) and f.id in records:
                found.append((node.lineno, f"{f.id}(...)"))
            if name in ROWS and any(k.arg is None for k in node.keywords):
                found.append((node.lineno, f"{name}(**...)"))  # its fields cannot be told: a watched one may be
            if name in BULK:
                for a in [*node.args, *(k.value for k in node.keywords)]:
                    for key in dict_keys(a):
                        found.append((node.lineno, f"{name}({{{key!r}: ...}})"))
                if name in ("insert", "update") and node.args and isinstance(node.args[0], ast.Name) \
                        and node.args[0].id in records:
                    found.append((node.lineno, f"{name}({node.args[0].id})"))
        if (isinstance(node, ast.Attribute) and node.attr == "__table__" and isinstance(node.value, ast.Name)
                and node.value.id in records):
            what = f"{node.value.id}.__table__"
            if what not in ALLOWED.get((module, owner.get(node)), ()):
                found.append((node.lineno, what))
    return found


def dict_keys(node):
    """The watched keys of the dicts in `node` (a dict literal, dict(...), or a list or tuple of them)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        for e in node.elts:
            yield from dict_keys(e)
    elif isinstance(node, ast.Dict):
        for k in node.keys:
            if isinstance(k, ast.Constant) and k.value in WATCHED:
                yield k.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        for k in node.keywords:
            if k.arg in WATCHED:
                yield k.arg


def imported_records(tree) -> set[str]:
    """The names the module gives History and Event (imported from the database module)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("server.db"):
            names |= {a.asname or a.name for a in node.names if a.name in RECORDS}
    return names


def modules():
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC)
        if p == WRITER or rel.parts[0] in NO_ROWS:
            continue
        yield rel, p


def test_only_lifecycle_writes_states_reasons_counts_and_backoff():
    found = [f"src/astraeus/{rel}:{line}: {what}" for rel, p in modules()
             for line, what in writes(p.read_text(), rel.as_posix())]
    assert not found, ("write these through a function of server/lifecycle.py (add a rule to its RULES when it "
                       "is a new transition):\n" + "\n".join(found))


def test_the_computed_setattrs_left_in_write_no_watched_field():
    from astraeus.server import db

    for (module, function), model in COMPUTED_SETATTR.items():
        assert f"def {function}(" in (SRC / module).read_text()
        assert not WATCHED & set(getattr(db, model).__table__.columns.keys()), model


def test_the_packages_left_out_hold_no_database_rows():
    for pkg in NO_ROWS:
        for p in sorted((SRC / pkg).rglob("*.py")):
            tree = ast.parse(p.read_text())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                for n in names:
                    assert not n.startswith(("astraeus.server", "sqlalchemy")), f"{p}: imports {n}"


def test_the_check_finds_every_kind_of_write():
    sample = """
w.state = "Running"
w.state, w.reason = "Failed", "x"
w.restarts += 1
(a.b).crash_streak = 0
m.restart_at: float = 1.0
setattr(w, "stop_kind", None)
setattr(w, name, None)
Worker(run_id=1, state="Pending")
session.execute(update(Worker).values(preemptions=3))
w.attempt += 1
x = w.state
w.machine_id = None
session.execute(insert(History).values({"run_id": 1, "state": "Failed", "reason": "x"}))
session.execute(insert(Event), [{"kind": "RunFailed"}])
session.execute(insert(Worker.__table__), [{"run_id": 1, "state": "Pending"}, dict(reason="x")])
History(**row)
Worker(**fields)
many.append((Event.__table__, events))
session.execute(select(History).where(History.run_id == 1))
threading.Event()
"""
    assert sorted(writes(sample)) == sorted([
        (2, "assignment to .state"), (3, "assignment to .state"), (3, "assignment to .reason"),
        (4, "assignment to .restarts"), (5, "assignment to .crash_streak"), (6, "assignment to .restart_at"),
        (7, "setattr of 'stop_kind'"), (8, "setattr of a computed name"), (9, "Worker(state=...)"),
        (10, "values(preemptions=...)"),
        (14, "values({'state': ...})"), (14, "values({'reason': ...})"), (14, "insert(History)"),
        (15, "insert(Event)"),
        (16, "execute({'state': ...})"), (16, "execute({'reason': ...})"),
        (17, "History(...)"), (18, "Worker(**...)"), (19, "Event.__table__"),
    ])


def test_a_module_s_own_history_and_event_are_the_database_s_only():
    source = """
from astraeus.server.db import Event as Ev
import threading
Ev(kind="x")
threading.Event()
"""
    assert writes(source, "server/x.py") == [(4, "Ev(...)")]


def test_lifecycle_itself_is_where_they_are_written():
    fields = {what.split(".")[-1] for _, what in writes(WRITER.read_text()) if what.startswith("assignment")}
    assert {"state", "reason", "stop_kind", "restarts", "preemptions", "crash_streak", "restart_at"} <= fields
