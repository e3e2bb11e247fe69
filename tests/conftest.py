"""Shared fixtures: a real local cluster (`astraeus up` as a subprocess), and in-process apps on SQLite and
PostgreSQL for the API tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from hypothesis import settings

# CI runs the property tests on a fixed set of examples, so that a red run is reproducible; on a developer's
# machine they explore new examples each time.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# `make test` runs the suite's files side by side (pytest-xdist: -n 4 --dist loadfile), each file's tests in
# order on one worker. Files that share something outside their tmp_path are one group, run one after the other
# on the same worker: the page's checkpoint folder /data/astraeus/ft-ckpt, which the recipe and the sbatch
# template remove and write, and the CLI's and the console's drive tests create. A test that touches what every
# test uses (it restarts the local PostgreSQL) is marked `serial`: `make test` runs those after, alone.
SHARED_GROUPS = {"tests/e2e/test_recipe.py": "ft-ckpt", "tests/e2e/test_sbatch_template.py": "ft-ckpt",
                 "tests/cli/test_commands.py": "ft-ckpt", "tests/console/test_browser.py": "ft-ckpt"}


# Files whose tests take minutes (by the durations `make test` prints), started first and in this order, so that
# none of them starts late and ends the suite alone while the other workers wait: xdist would start the files with
# the most tests first, and these have few. The other files follow, those with the most tests first.
RUN_FIRST = ["tests/examples/test_readmes.py", "tests/faults/test_agent_faults.py", "tests/faults/test_fuzz.py",
             "tests/e2e/test_ft_lowprio.py", "tests/e2e/test_slurm_in_job.py", "tests/examples/test_demo.py",
             "tests/schedules/test_live.py", "tests/e2e/test_container_finetune.py", "tests/fleet/test_nfs.py",
             "tests/faults/test_partition.py", "tests/e2e/test_gang_finetune.py", "tests/e2e/test_reservations_live.py",
             "tests/e2e/test_gang_torchrun.py", "tests/faults/test_resubmit.py"]


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(path, path)


def pytest_collection_modifyitems(config, items):
    """The files in RUN_FIRST's order, then by their count of tests (most first); each file's tests as they were.
    Every xdist worker collects the same order, and FileGroups hands the files out in it."""
    first = {path: k for k, path in enumerate(RUN_FIRST)}
    count: dict[str, int] = {}
    for item in items:
        count[_scope(item.nodeid)] = count.get(_scope(item.nodeid), 0) + 1
    at = {scope: k for k, scope in enumerate(count)}  # ties: as collected
    items.sort(key=lambda item: (first.get(_scope(item.nodeid), len(first)), -count[_scope(item.nodeid)],
                                 at[_scope(item.nodeid)]))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with SHARED_GROUPS' files as one scope (xdist's own loadgroup cannot read its marks from
    pytest 9's node ids), handed out in the order of the collection (`pytest_collection_modifyitems`)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False  # the collection's order, not xdist's count of tests
    return FileGroups(config, log)


ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            out[k] = v
    return out


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns something true, and return that; fail the test after `timeout`."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


@dataclass
class Cluster:
    home: Path
    port: int
    proc: subprocess.Popen
    vars: dict[str, str] = field(default_factory=dict)

    @property
    def api(self) -> str:
        return self.vars["API"]

    @property
    def token(self) -> str:
        return self.vars["ASTRAEUS_TOKEN"]

    @property
    def admin_token(self) -> str:
        return self.vars["ASTRAEUS_ADMIN_TOKEN"]

    @property
    def server(self) -> str:
        return self.vars["ASTRAEUS_SERVER"]

    @property
    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e.update(self.vars)
        e["PATH"] = f"{VENV_BIN}:{e.get('PATH', '')}"
        e["ASTRAEUS_CONFIG"] = str(self.home / "cli-config.json")
        return e

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.api, headers={"Authorization": f"Bearer {token or self.token}"},
                            timeout=30)

    def admin(self) -> httpx.Client:
        org = self.api.split("/o/")[1].split("/")[0]
        return httpx.Client(base_url=f"{self.server}/api/v1/o/{org}",
                            headers={"Authorization": f"Bearer {self.admin_token}"}, timeout=30)

    def wait_for(self, predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
        return wait_for(predicate, timeout, interval, what)

    def run(self, name: str) -> dict:
        with self.client() as c:
            return c.get(f"/runs/{name}").json()

    def worker(self, name: str) -> dict:
        with self.client() as c:
            return c.get(f"/workers/{name}").json()

    def logs(self, worker: str) -> str:
        with self.client() as c:
            return c.get(f"/workers/{worker}/logs").text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_cluster(home: Path, *, gpus: int = 8, machines: int = 1, stop_grace: float = 2.0,
                  extra_args: list[str] | None = None, env: dict | None = None, timeout: float = 60) -> Cluster:
    """`astraeus up` in a fresh home: the real control plane and real agents, with a short stop grace. A port that
    another process took between free_port() and the server's bind (the suite runs its files side by side) is
    tried again with another."""
    e = dict(os.environ)
    e["ASTRAEUS_STOP_GRACE"] = str(stop_grace)
    e["ASTRAEUS_HEARTBEAT"] = "1"
    # The process runtime unless the test asks for another (env, or --runtime in extra_args): on a GPU machine with
    # the container tools, auto would choose containers, and most tests' runs name images no registry here serves.
    e.setdefault("ASTRAEUS_RUNTIME", "process")
    e.update(env or {})
    home.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        try:
            return _up(home, e, gpus, machines, extra_args, timeout)
        except PortTaken:
            (home / "env").unlink(missing_ok=True)
    raise RuntimeError("astraeus up found its port taken three times")


class PortTaken(RuntimeError):
    pass


def _up(home: Path, e: dict, gpus: int, machines: int, extra_args: list[str] | None, timeout: float) -> Cluster:
    port = free_port()
    log = open(home / "up.log", "ab")
    start = log.tell()
    cmd = [str(VENV_BIN / "astraeus"), "up", "--home", str(home), "--port", str(port), "--gpus", str(gpus),
           "--machines", str(machines), *(extra_args or [])]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=e, start_new_session=True)
    c = Cluster(home=home, port=port, proc=proc)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            said = (home / "up.log").read_bytes()[start:].decode(errors="replace")
            if f"address ('127.0.0.1', {port}): address already in use" in said:
                raise PortTaken(port)
            raise RuntimeError(f"astraeus up exited with {proc.returncode}: {said[-3000:]}")
        if (home / "env").exists():
            c.vars = read_env(home / "env")
            if "API" in c.vars:
                return c
        time.sleep(0.1)
    c.stop()
    raise RuntimeError(f"astraeus up was not ready in {timeout}s: {(home / 'up.log').read_text()[-3000:]}")


@pytest.fixture
def cluster(tmp_path):
    """A fresh local cluster for one test: one machine gpu-01 with 8 simulated GPUs, a 2 s stop grace."""
    c = start_cluster(tmp_path / "home")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """One local cluster shared by a module's tests (each test uses its own run names)."""
    c = start_cluster(tmp_path_factory.mktemp("shared") / "home")
    yield c
    c.stop()


# ------------------------------------------------------------------------------------ container runtime
# One local registry and one push of the python test image per test session, shared by every test that runs
# workers in containers (tests/runtimes.py, tests/oci.py), tests/containers included (its conftest.py adds the
# busybox image and a registry with a password).


def _skip_without_containers() -> None:
    from tests.runtimes import container_skip_reason

    reason = container_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def registry():
    """A docker-registry on 127.0.0.1 over plain HTTP, no auth (list registry.host as insecure)."""
    from tests import oci

    _skip_without_containers()
    reg = oci.Registry()
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="session")
def python_layout(tmp_path_factory) -> str:
    from tests import oci

    _skip_without_containers()
    return oci.build_python_image(str(tmp_path_factory.mktemp("python-layout") / "oci"))


@pytest.fixture(scope="session")
def python_image(registry, python_layout) -> str:
    """"127.0.0.1:PORT/test/python:3.11" (Debian bookworm minbase + python3) in the `registry` fixture."""
    from tests import oci

    return oci.push(python_layout, registry, "test/python:3.11")


@pytest.fixture(scope="session")
def containers(registry, python_image, tmp_path_factory):
    """What the container variant of a test needs (tests.runtimes.Containers): the image, its registry, and an
    image cache with the image already pulled, shared by the session's runtimes and agents."""
    from astraeus.agent.runtime.oci_images import ImageCache
    from tests.runtimes import Containers

    cache = str(tmp_path_factory.mktemp("image-cache"))
    ImageCache(cache, insecure=[registry.host]).pull(python_image)
    return Containers(image=python_image, registry=registry.host, cache_dir=cache)


@pytest.fixture(params=["process", "container"])
def runtime_kind(request) -> str:
    """"process" or "container" (ids of the same name): a test using it runs on both runtimes."""
    if request.param == "container":
        _skip_without_containers()
    return request.param


@dataclass
class RuntimeChoice:
    """The runtime a test's machines use: `env` for `astraeus agent` / `astraeus up` (ASTRAEUS_RUNTIME, and for
    containers the insecure registry and the shared, pre-pulled image cache), `image` for its runs."""

    kind: str
    image: str
    env: dict[str, str]


@pytest.fixture
def runtime(runtime_kind, request) -> RuntimeChoice:
    """A test using it runs once with process-runtime machines and once with container-runtime machines (ids
    "process"/"container"); its runs name `runtime.image` (the python test image in the session's registry for
    containers; any name for the process runtime, which runs the command on the host)."""
    from tests.runtimes import runtime_env

    if runtime_kind == "container":
        c = request.getfixturevalue("containers")
        return RuntimeChoice("container", c.image, runtime_env("container", c))
    return RuntimeChoice("process", "python:3.11", runtime_env("process", None))


# ------------------------------------------------------------------------------------ in-process apps


def postgres_url() -> str:
    """A fresh database on the local PostgreSQL for this test session."""
    import psycopg

    name = "astraeus_test_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def postgres_copy(template_url: str) -> str:
    """A fresh database on the local PostgreSQL made as a copy of `template_url`'s (CREATE DATABASE ... TEMPLATE)."""
    import psycopg

    name = "astraeus_test_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template_url.rsplit('/', 1)[1]}")
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def drop_postgres(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@dataclass
class App:
    client: object  # fastapi TestClient
    boot: dict
    cp: object
    url: str

    @property
    def api(self) -> str:
        return f"/api/v1/o/{self.boot['org']}/w/{self.boot['workspace']}"

    def h(self, token: str | None = None) -> dict:
        return {"Authorization": f"Bearer {token or self.boot['token']}"}


def make_app(tmp_path: Path, database_url: str | None, run_loop: bool = True):
    from fastapi.testclient import TestClient

    from astraeus.app import create_app
    from astraeus.main import bootstrap
    from astraeus.server.core import ControlPlane
    from astraeus.settings import ServerSettings

    settings = ServerSettings(home=tmp_path / "home", database_url=database_url)
    cp = ControlPlane.open(settings)
    boot = bootstrap(cp, "acme", "vision", "main", ["/data/astraeus"])
    return TestClient(create_app(settings, cp, run_loop=run_loop)), boot, cp, settings.url()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> Path:
    """A SQLite database migrated to the newest revision once per session, for the in-process apps to copy (each
    test's control plane still opens it with db.migrate, which finds it at head). tests/migrations start from
    empty databases and older revisions instead."""
    from astraeus.server import db

    path = tmp_path_factory.mktemp("migrated") / "astraeus.db"
    engine = db.make_engine(f"sqlite:///{path}")
    db.migrate(engine)
    engine.dispose()
    return path


@pytest.fixture(scope="session")
def migrated_postgres():
    """A PostgreSQL database migrated once per session: the template each in-process app's database is copied from."""
    from astraeus.server import db

    url = postgres_url()
    engine = db.make_engine(url)
    db.migrate(engine)
    engine.dispose()  # CREATE DATABASE ... TEMPLATE needs the template without connections
    yield url
    drop_postgres(url)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def app(request, tmp_path):
    """The control plane in process, on SQLite and on PostgreSQL, each test on a database of its own (a copy of
    one migrated once per session)."""
    if request.param == "postgresql":
        url = postgres_copy(request.getfixturevalue("migrated_postgres"))
    else:
        url = None
        (tmp_path / "home").mkdir()
        shutil.copyfile(request.getfixturevalue("migrated_sqlite"), tmp_path / "home" / "astraeus.db")
    client, boot, cp, real_url = make_app(tmp_path, url)
    with client:
        yield App(client, boot, cp, real_url)
    cp.engine.dispose()
    if url:
        drop_postgres(url)
