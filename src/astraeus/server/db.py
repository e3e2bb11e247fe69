"""Storage: SQLAlchemy 2 models, the engine, and migrations at start-up.

SQLite (WAL) under the home by default; PostgreSQL through ASTRAEUS_DATABASE_URL. Times are epoch seconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    false,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, sessionmaker


class Base(DeclarativeBase):
    pass


def now() -> float:
    return time.time()


class Org(Base):
    __tablename__ = "orgs"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)


class Cluster(Base):
    __tablename__ = "clusters"
    id: Mapped[int] = mapped_column(primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("orgs.id"))
    name: Mapped[str] = mapped_column(String(63))
    preemption: Mapped[bool] = mapped_column(Boolean, default=True)
    lost_after_seconds: Mapped[float] = mapped_column(Float, default=60.0)
    # Revision 0020: victims of equal priority stopped first: "recent" (most recently started) or "least-work-lost"
    preemption_victims: Mapped[str] = mapped_column(String(24), default="recent", server_default="recent")
    # Revision 0021 (issue 46): who may share a GPU: "workspace" (tenants of one workspace) or "any".
    gpu_sharing: Mapped[str] = mapped_column(String(16), default="workspace", server_default="workspace")
    # Revision 0023 (issue 46): how machines and GPUs are chosen: "fgd", "bestfit" or "spread" (scheduler.fragments)
    placement: Mapped[str] = mapped_column(String(16), default="bestfit", server_default="bestfit")
    __table_args__ = (UniqueConstraint("org_id", "name"),)


class Workspace(Base):
    __tablename__ = "workspaces"
    id: Mapped[int] = mapped_column(primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("orgs.id"))
    name: Mapped[str] = mapped_column(String(63))
    ns: Mapped[str] = mapped_column(String(15), unique=True)  # "ws-" + 12 hex
    __table_args__ = (UniqueConstraint("org_id", "name"),)


class Access(Base):
    """A workspace's access to a cluster: quota, weight, max priority and granted host paths."""

    __tablename__ = "access"
    id: Mapped[int] = mapped_column(primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    max_priority: Mapped[int] = mapped_column(Integer, default=0)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    quota_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    quota_cpu_cores: Mapped[float | None] = mapped_column(Float, nullable=True)
    quota_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    quota_workers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    host_paths: Mapped[list] = mapped_column(JSON, default=list)
    # Revision 0009: the pools of the cluster the workspace may use (names); None: every machine of the cluster.
    pools: Mapped[list | None] = mapped_column(JSON, nullable=True)
    # Revision 0014: the workspace's runs on the cluster may ask for the machine's own network (`network: host`).
    host_network: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Revision 0015: the image its runs on the cluster use when they name none (a batch script as written).
    default_image: Mapped[str | None] = mapped_column(String(512), nullable=True)
    # Revision 0018: at most this many GPUs held at once by one user's runs of the workspace here; None: no limit.
    max_gpus_per_user: Mapped[int | None] = mapped_column(Integer, nullable=True)
    __table_args__ = (UniqueConstraint("workspace_id", "cluster_id"),)


class Token(Base):
    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the secret; never the secret
    kind: Mapped[str] = mapped_column(String(16))  # user | org_admin | machine
    org_id: Mapped[int] = mapped_column(ForeignKey("orgs.id"))
    workspace_id: Mapped[int | None] = mapped_column(ForeignKey("workspaces.id"), nullable=True)
    cluster_id: Mapped[int | None] = mapped_column(ForeignKey("clusters.id"), nullable=True)
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)  # viewer | editor | admin
    created_at: Mapped[float] = mapped_column(Float, default=now)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    # A machine's own credential (kind "machine") names its machine: it reads and reports for that one only.
    machine_id: Mapped[int | None] = mapped_column(ForeignKey("machines.id"), nullable=True, index=True)
    # Revision 0018: the user or service account it belongs to (None: a machine's, or a join token). Not a
    # foreign key: adding one would make SQLite copy `tokens`, which console sessions point at.
    user_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)


class User(Base):
    """Revision 0018: a named identity of an organisation: a person (`alice`) or a service account (`service:ci`,
    kind "service"). Its roles per workspace are UserRole rows; an org admin administers the organisation."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("orgs.id"))
    name: Mapped[str] = mapped_column(String(80))
    kind: Mapped[str] = mapped_column(String(16), default="person")  # person | service
    display_name: Mapped[str] = mapped_column(String(200), default="")
    email: Mapped[str | None] = mapped_column(String(255), nullable=True)
    org_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    sso_subject: Mapped[str | None] = mapped_column(String(255), nullable=True)  # revision 0022: the provider's sub
    __table_args__ = (UniqueConstraint("org_id", "name"),)


class UserRole(Base):
    """Revision 0018: a user's role in one workspace (viewer | editor | admin)."""

    __tablename__ = "user_roles"
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    role: Mapped[str] = mapped_column(String(16))
    __table_args__ = (UniqueConstraint("user_id", "workspace_id"),)


class SsoProvider(Base):
    """Revision 0022: an organisation's OpenID Connect provider (single sign-on) and how its groups map to roles."""

    __tablename__ = "sso_providers"
    id: Mapped[int] = mapped_column(primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("orgs.id"), unique=True)
    name: Mapped[str] = mapped_column(String(100))  # the sign-in button's "Sign in with NAME"
    issuer: Mapped[str] = mapped_column(String(500))
    client_id: Mapped[str] = mapped_column(String(200))
    client_secret: Mapped[str | None] = mapped_column(String(500), nullable=True)  # never shown back
    cli_client_id: Mapped[str | None] = mapped_column(String(200), nullable=True)  # `astra login --sso`'s client
    match_by: Mapped[str] = mapped_column(String(16), default="sub", server_default="sub")  # sub | email
    groups_claim: Mapped[str] = mapped_column(String(100), default="groups", server_default="groups")
    roles: Mapped[list] = mapped_column(JSON, default=list)  # [{"group", "workspace", "role"}]
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class SsoLogin(Base):
    """Revision 0022: a console sign-in sent to the provider and not yet back (its state's digest, PKCE verifier)."""

    __tablename__ = "sso_logins"
    id: Mapped[int] = mapped_column(primary_key=True)
    state: Mapped[str] = mapped_column(String(64), unique=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("orgs.id"))
    verifier: Mapped[str] = mapped_column(String(128))
    nonce: Mapped[str] = mapped_column(String(64))
    next: Mapped[str] = mapped_column(String(500))
    expires_at: Mapped[float] = mapped_column(Float)


class AuditEntry(Base):
    """Revision 0018: one change asked through the API (or the console, or astra), allowed or refused. Append-only:
    rows are only added, and trimmed after `audit_retention_days`. Never a secret: the path and object, no body."""

    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(primary_key=True)
    org: Mapped[str | None] = mapped_column(String(63), nullable=True)
    time: Mapped[float] = mapped_column(Float, default=now, index=True)
    user: Mapped[str | None] = mapped_column(String(80), nullable=True)  # None: the token was not known
    workspace: Mapped[str | None] = mapped_column(String(63), nullable=True)
    action: Mapped[str] = mapped_column(String(16))  # create | update | delete | the method
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(500))
    object: Mapped[str] = mapped_column(String(200), default="")
    address: Mapped[str | None] = mapped_column(String(64), nullable=True)
    status: Mapped[int] = mapped_column(Integer)
    allowed: Mapped[bool] = mapped_column(Boolean)


class ConsoleSession(Base):
    """A signed-in console: its own secret (the cookie), its CSRF token, and the API token it acts as."""

    __tablename__ = "console_sessions"
    id: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the cookie's secret
    csrf: Mapped[str] = mapped_column(String(64))
    token_id: Mapped[int] = mapped_column(ForeignKey("tokens.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    expires_at: Mapped[float] = mapped_column(Float)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class Machine(Base):
    __tablename__ = "machines"
    id: Mapped[int] = mapped_column(primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    name: Mapped[str] = mapped_column(String(63))
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpu_models: Mapped[list] = mapped_column(JSON, default=list)
    # Revision 0024 (issue 46): each GPU's memory (bytes) and MIG devices (profile -> count), as its agent reports
    gpu_memory: Mapped[list | None] = mapped_column(JSON, nullable=True)
    gpu_mig: Mapped[list | None] = mapped_column(JSON, nullable=True)
    # Revision 0025 (issue 46): its NVLink islands (lists of GPU indices), as its agent reports them; None: one island
    nvlink_islands: Mapped[list | None] = mapped_column(JSON, nullable=True)
    cpu_cores: Mapped[float] = mapped_column(Float, default=1.0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    stop_grace_seconds: Mapped[float] = mapped_column(Float, default=30.0)
    labels: Mapped[dict] = mapped_column(JSON, default=dict)
    # How its agent runs workers ("container (runc 1.1.5)", "process"); None from an agent before revision 0005.
    runtime: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Revision 0006: where other machines reach it; its shared filesystems {name: mount path}; its NFS abilities
    # ({"server": "ganesha"|"kernel"|None, "client": bool, "rdma": bool}). None/empty from an older agent.
    address: Mapped[str | None] = mapped_column(String(64), nullable=True)
    shared_filesystems: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    nfs: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="Ready")  # Ready | Lost
    # Revision 0013: its agent's state dir's filesystem as last reported (protocol.Disk); None from an older agent
    disk_path: Mapped[str | None] = mapped_column(String(4096), nullable=True)
    disk_free_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    disk_total_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Revision 0019 (server/health.py): None | "cordon" (no new work) | "drain" (no new work, what ran was stopped),
    # why, by whom ("admin" | "health-check") and since when; its failed GPUs {"3": {"what": "XID 79", ...}}.
    cordon: Mapped[str | None] = mapped_column(String(16), nullable=True)
    cordon_reason: Mapped[str | None] = mapped_column(String(500), nullable=True)
    cordon_by: Mapped[str | None] = mapped_column(String(16), nullable=True)
    cordon_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_faults: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    last_heartbeat: Mapped[float] = mapped_column(Float, default=now)
    registered_at: Mapped[float] = mapped_column(Float, default=now)
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)


class Pool(Base):
    """Revision 0009: a named group of a cluster's machines, by name (`machines`) and/or by label (`labels`: every
    one must match). Membership is worked out when used, so a machine that registers later with the labels joins."""

    __tablename__ = "pools"
    id: Mapped[int] = mapped_column(primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    name: Mapped[str] = mapped_column(String(63))
    machines: Mapped[list] = mapped_column(JSON, default=list)
    labels: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)


class Reservation(Base):
    """Revision 0009: machines of one cluster kept for some workspaces from `start_at` to `end_at` (None: no end).
    `machines` are the names chosen when it was made (given by name, or `count` machines of `pool`). `opened` and
    `closed` record that the window's events were written (each once)."""

    __tablename__ = "reservations"
    id: Mapped[int] = mapped_column(primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("orgs.id"))
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), index=True)
    name: Mapped[str] = mapped_column(String(63))
    workspaces: Mapped[list] = mapped_column(JSON, default=list)  # workspace ids
    machines: Mapped[list] = mapped_column(JSON, default=list)  # machine names
    pool: Mapped[str | None] = mapped_column(String(63), nullable=True)
    count: Mapped[int | None] = mapped_column(Integer, nullable=True)
    start_at: Mapped[float] = mapped_column(Float)
    end_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    opened: Mapped[bool] = mapped_column(Boolean, default=False)
    closed: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    # Revision 0018: who made it and who last changed it (a user's name, `service:NAME`; None: before 0018).
    created_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    updated_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    __table_args__ = (UniqueConstraint("org_id", "name"),)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    name: Mapped[str] = mapped_column(String(63))
    # "" while the run exists; its uid once deleted, so the name can be used again.
    live_key: Mapped[str] = mapped_column(String(32), default="")
    labels: Mapped[dict] = mapped_column(JSON, default=dict)
    spec: Mapped[dict] = mapped_column(JSON)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="Pending")
    reason: Mapped[str] = mapped_column(Text, default="")
    queue_reason: Mapped[str] = mapped_column(Text, default="")  # the scheduler's word, kept beside `reason`
    created_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    preempted_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    quota_noted: Mapped[bool] = mapped_column(Boolean, default=False)
    deleting: Mapped[bool] = mapped_column(Boolean, default=False)
    # Revision 0008: where the run came from. The template it named (and that template's version then); the
    # schedule or replica group that made it (their ids: not foreign keys, a run outlives a deleted schedule); a
    # job array's name, this run's index in it and how many of the array may run at once.
    template: Mapped[str | None] = mapped_column(String(63), nullable=True)
    template_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    schedule_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    group_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    array_job: Mapped[str | None] = mapped_column(String(63), nullable=True, index=True)
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_max_running: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Revision 0016: `scontrol hold` (PATCH held): a held run stays Pending and is never offered to the scheduler.
    held: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Revision 0018: who made it and who last changed it (a user's name, `service:NAME`; None: before 0018).
    created_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    updated_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    workers: Mapped[list[Worker]] = relationship(back_populates="run", order_by="Worker.index")
    __table_args__ = (UniqueConstraint("workspace_id", "name", "live_key"), Index("ix_runs_state", "state"),
                      # revision 0010: GET $API/runs' keyset pages, newest first, with and without a state
                      Index("ix_runs_list", "workspace_id", "live_key", "created_at", "id"),
                      Index("ix_runs_list_state", "workspace_id", "live_key", "state", "created_at", "id"),
                      # revision 0012: room on each page for a waiting run's new queue reason (a HOT update)
                      {"postgresql_with": {"fillfactor": 70}})


class Worker(Base):
    __tablename__ = "workers"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    name: Mapped[str] = mapped_column(String(80))
    index: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="Pending")
    reason: Mapped[str] = mapped_column(Text, default="")
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    machine_id: Mapped[int | None] = mapped_column(ForeignKey("machines.id"), nullable=True)
    gpus: Mapped[int] = mapped_column(Integer, default=0)  # GPUs this worker asks for
    gpu_indices: Mapped[list] = mapped_column(JSON, default=list)
    cpu_cores: Mapped[float] = mapped_column(Float, default=0.0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # What the control plane wants the agent to do with the current attempt: Running or Stopped.
    desired: Mapped[str | None] = mapped_column(String(16), nullable=True)
    stop_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)  # preempt|timelimit|delete|gang|lost
    stop_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    preempted_for: Mapped[str | None] = mapped_column(String(63), nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    environment: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    placed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stop_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # When the time limit stops this attempt (from its start); None without a limit.
    deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    why_not: Mapped[list] = mapped_column(JSON, default=list)
    # Crash-loop backoff: a failed worker that restarts waits until `restart_at` (epoch seconds) before the
    # scheduler places it again; `crash_streak` counts failures in a row that came soon after a start.
    restart_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    crash_streak: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Revision 0006: a multi-machine gang's rendezvous for this attempt (astraeus.rendezvous), set when placed.
    rendezvous: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # Revision 0020 (issue 47): its last progress (time, text) and checkpoint this attempt; when found stalled.
    progress_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    progress_text: Mapped[str | None] = mapped_column(String(200), nullable=True)
    checkpoint_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stalled_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Revision 0021 (issue 46): thousandths of its one GPU a fractional worker shares (gpus is then 1); 0: whole.
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Revision 0025 (issue 46): the MIG devices it holds, [gpu, profile, k] each (its gpu_milli is then their share of
    # a GPU, N/7 per "Ng.*" device); None: none
    mig_devices: Mapped[list | None] = mapped_column(JSON, nullable=True)
    run: Mapped[Run] = relationship(back_populates="workers")
    machine: Mapped[Machine | None] = relationship()
    __table_args__ = (Index("ix_workers_machine", "machine_id"), Index("ix_workers_run", "run_id"),
                      Index("ix_workers_deadline", "deadline"),
                      # revision 0012: room on each page for a waiting worker's new why-not lines (a HOT update)
                      {"postgresql_with": {"fillfactor": 70}})


class History(Base):
    __tablename__ = "history"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    time: Mapped[float] = mapped_column(Float, default=now)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(primary_key=True)
    workspace_id: Mapped[int | None] = mapped_column(ForeignKey("workspaces.id"), nullable=True, index=True)
    time: Mapped[float] = mapped_column(Float, default=now)
    kind: Mapped[str] = mapped_column(String(40))
    object: Mapped[str] = mapped_column(String(200), default="")
    message: Mapped[str] = mapped_column(Text, default="")


class LogLine(Base):
    __tablename__ = "log_lines"
    id: Mapped[int] = mapped_column(primary_key=True)
    worker_id: Mapped[int] = mapped_column(ForeignKey("workers.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    stream: Mapped[str] = mapped_column(String(8), default="stdout")
    text: Mapped[str] = mapped_column(Text)
    # revision 0011: a worker's lines in the order they came (read_logs, a follower's `after`, trimming)
    __table_args__ = (UniqueConstraint("worker_id", "attempt", "seq"), Index("ix_log_lines_worker", "worker_id", "id"))


class LogUsage(Base):
    """Revision 0011: how many log lines and bytes a worker keeps (a running count kept by agents.store_logs, so
    that a flood of lines is checked against the worker's log limits without counting its rows)."""

    __tablename__ = "log_usage"
    id: Mapped[int] = mapped_column(primary_key=True)
    worker_id: Mapped[int] = mapped_column(ForeignKey("workers.id"), unique=True)
    lines: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class Drive(Base):
    __tablename__ = "drives"
    id: Mapped[int] = mapped_column(primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    # Revision 0018: who made it and who last changed it (a user's name, `service:NAME`; None: before 0018).
    created_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    updated_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)


class Template(Base):
    """A workspace's run template (revision 0008): any part of a run's spec, named; `version` grows by one at each
    change, and a run records the version it was made from."""

    __tablename__ = "templates"
    id: Mapped[int] = mapped_column(primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    name: Mapped[str] = mapped_column(String(63))
    labels: Mapped[dict] = mapped_column(JSON, default=dict)  # merged into its runs' labels
    spec: Mapped[dict] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    # Revision 0018: who made it and who last changed it (a user's name, `service:NAME`; None: before 0018).
    created_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    updated_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)


class Schedule(Base):
    """A workspace's schedule (revision 0008): a cron line and a run to make at each tick."""

    __tablename__ = "schedules"
    id: Mapped[int] = mapped_column(primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    last_tick: Mapped[float | None] = mapped_column(Float, nullable=True)  # the last tick handled (made or skipped)
    next_tick: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Revision 0018: who made it and who last changed it (a user's name, `service:NAME`; None: before 0018).
    created_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    updated_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)


class ScheduleTick(Base):
    """One tick of a schedule, handled once: the unique (schedule, tick) is what makes a tick create exactly one run
    across restarts and replicas. `outcome`: Created | Skipped | Refused."""

    __tablename__ = "schedule_ticks"
    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(Integer, index=True)
    tick: Mapped[str] = mapped_column(String(12))  # YYYYMMDDHHMM in the schedule's time zone
    at: Mapped[float] = mapped_column(Float, default=now)  # the tick's instant
    outcome: Mapped[str] = mapped_column(String(16))
    run_name: Mapped[str | None] = mapped_column(String(63), nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    handled_at: Mapped[float] = mapped_column(Float, default=now)
    __table_args__ = (UniqueConstraint("schedule_id", "tick"),)


class ReplicaGroup(Base):
    """A workspace's replica group (revision 0008): keeps `spec.replicas` runs of `spec.run` alive."""

    __tablename__ = "replica_groups"
    id: Mapped[int] = mapped_column(primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    failures: Mapped[int] = mapped_column(Integer, default=0)  # replicas failed in a row: the backoff grows with it
    retry_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # no replacement before this
    serial: Mapped[int] = mapped_column(Integer, default=0)  # the last replica number used in a run name
    # Revision 0018: who made it and who last changed it (a user's name, `service:NAME`; None: before 0018).
    created_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    updated_by: Mapped[str | None] = mapped_column(String(80), nullable=True)
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)


class RegistryCredential(Base):
    """A workspace's credential for one image registry (host[:port]): given to its workers' machines when they
    pull the image of one of its runs, never shown back. The password is stored as a secret env value is (in the
    database, 0600 on SQLite), and never returned, logged or put in an event."""

    __tablename__ = "registry_credentials"
    id: Mapped[int] = mapped_column(primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    host: Mapped[str] = mapped_column(String(255))  # host[:port], as astraeus.imageref.registry_of names it
    username: Mapped[str] = mapped_column(String(255))
    password: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    __table_args__ = (UniqueConstraint("workspace_id", "host"),)

    def __repr__(self) -> str:  # never the password
        return f"RegistryCredential(workspace_id={self.workspace_id}, host={self.host!r}, " \
               f"username={self.username!r})"


class Lease(Base):
    """The scheduling leader's lease (revision 0007; astraeus.server.leader): one row per lease `name`. `holder`
    is the replica that holds it, `epoch` grows by one each time it is taken anew, and `expires_at` is judged by
    the database's clock (epoch seconds from PostgreSQL's clock_timestamp(); the process clock on SQLite, where
    there is one replica)."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(200), nullable=True)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    expires_at: Mapped[float] = mapped_column(Float, default=0.0)
    acquired_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    renewed_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class UsageRecord(Base):
    """Revision 0017: one worker attempt's use of a machine (accounting, astraeus.usage), written when the attempt
    ends (lifecycle.ended). Names are copied and no foreign key points at a run, a worker or a machine: the record is
    kept after its run is deleted."""

    __tablename__ = "usage_records"
    id: Mapped[int] = mapped_column(primary_key=True)
    org_id: Mapped[int] = mapped_column(ForeignKey("orgs.id"))
    workspace_id: Mapped[int] = mapped_column(Integer)
    workspace: Mapped[str] = mapped_column(String(63))
    cluster: Mapped[str] = mapped_column(String(63))
    run_id: Mapped[int] = mapped_column(Integer)
    run_uid: Mapped[str] = mapped_column(String(32))
    run: Mapped[str] = mapped_column(String(63))
    worker: Mapped[str] = mapped_column(String(80))
    attempt: Mapped[int] = mapped_column(Integer)
    user: Mapped[str | None] = mapped_column(String(80), nullable=True)  # the run's created_by
    pool: Mapped[str | None] = mapped_column(String(63), nullable=True)
    machine: Mapped[str | None] = mapped_column(String(63), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    gpus: Mapped[int] = mapped_column(Integer)
    cpu_cores: Mapped[float] = mapped_column(Float)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[float] = mapped_column(Float)  # placed on its machine: its GPUs were held from then
    ended_at: Mapped[float] = mapped_column(Float)
    wait_seconds: Mapped[float] = mapped_column(Float)  # in the queue before it was placed
    restart_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # its worker's restart backoff, if any
    state: Mapped[str] = mapped_column(String(16))  # Succeeded | Failed | Cancelled | Preempted
    reason: Mapped[str] = mapped_column(Text)
    preempted_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    __table_args__ = (Index("ix_usage_records_workspace", "workspace_id", "ended_at"),
                      Index("ix_usage_records_org", "org_id", "ended_at"),
                      Index("ix_usage_records_run", "run_id", "worker"))


# ------------------------------------------------------------------------------------------- the engine


def private_sqlite(url: str) -> None:
    """The SQLite file (tokens' digests, every run's env and configs) and its -wal/-shm: 0600. SQLite makes the
    -wal and -shm with the database file's mode, so making the file first at 0600 covers them too."""
    from sqlalchemy.engine import make_url

    path = make_url(url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for p in (path, path + "-wal", path + "-shm"):
        if os.path.exists(p):
            os.chmod(p, 0o600)


def make_engine(url: str, share: int = 1) -> Engine:
    """`share`: how many server processes share the database from this host (`astraeus server --processes`): on
    PostgreSQL each gets that part of the pool (20 + 40 connections), so N of them open no more than one would."""
    if url.startswith("sqlite"):
        private_sqlite(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20,
                               max_overflow=40)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # WAL: readers never wait for the writer
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return create_engine(url, pool_size=max(2, 20 // share), max_overflow=max(4, 40 // share), pool_pre_ping=True)


# The transaction-level advisory lock that `migrate` upgrades under on PostgreSQL (any bigint; "astraMIG").
MIGRATE_LOCK = 0x617374724D4947


class SchemaTooNew(RuntimeError):
    """The database's schema revision is unknown to this code: a newer astraeus migrated it."""


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest alembic revision (creating it on an empty database).

    On PostgreSQL, several replicas may start at once: the upgrade runs under a transaction-level advisory lock
    (MIGRATE_LOCK), so one migrates while the others wait, then find it done. A database at a revision this code
    does not know (a newer astraeus upgraded it) is refused with SchemaTooNew, before anything is changed."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError
    from sqlalchemy import text

    here = Path(__file__).parent / "migrations"
    cfg = Config()
    cfg.set_main_option("script_location", str(here))
    script = ScriptDirectory.from_config(cfg)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATE_LOCK})
        current = MigrationContext.configure(conn).get_current_heads()
        for rev in current:
            try:
                known = script.get_revision(rev)
            except (CommandError, KeyError):
                known = None
            if known is None:
                heads = ", ".join(script.get_heads())
                raise SchemaTooNew(f"the database is at schema revision {rev}, newer than this astraeus (knows up "
                                   f"to {heads}): upgrade astraeus")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class AlreadyServing(RuntimeError):
    """Another process serves this SQLite database."""


def hold_sqlite(url: str):
    """Take an exclusive lock on a file beside the SQLite database (`<db>.lock`, flock) for as long as the
    returned file stays open; AlreadyServing when another process holds it. SQLite is the one-process embedded
    default: several replicas need PostgreSQL. Returns None for a database that is not a SQLite file."""
    import fcntl

    from sqlalchemy.engine import make_url

    u = make_url(url)
    path = u.database
    if u.get_backend_name() != "sqlite" or not path or path == ":memory:" or path.startswith("file:"):
        return None
    lock = open(path + ".lock", "a+")  # noqa: SIM115 - held open while serving
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        who = lock.read().strip() or "another process"
        lock.close()
        raise AlreadyServing(
            f"another astraeus server ({who}) is serving the SQLite database {path}: SQLite serves one control-plane "
            "process; stop that one first, or run several replicas on PostgreSQL (set ASTRAEUS_DATABASE_URL)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock


def session_factory(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
