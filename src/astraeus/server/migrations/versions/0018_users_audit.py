"""Users and the audit log (issue 45): named identities, who created and changed objects, an append-only audit log.

Existing tokens gain an owner: an organisation admin token the user `admin` (an org admin), a workspace token a
service account named after what it was (`service:<workspace>-<role>`, with that role there); machine tokens
stay their machine's.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

OWNED = ("runs", "drives", "templates", "schedules", "replica_groups", "reservations")


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("org_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("email", sa.String(length=255), nullable=True),
        sa.Column("org_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("org_id", "name"),
    )
    op.create_table(
        "user_roles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("user_id", "workspace_id"),
    )
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("org", sa.String(length=63), nullable=True),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("user", sa.String(length=80), nullable=True),
        sa.Column("workspace", sa.String(length=63), nullable=True),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("method", sa.String(length=8), nullable=False),
        sa.Column("path", sa.String(length=500), nullable=False),
        sa.Column("object", sa.String(length=200), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("allowed", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_time", "audit", ["time"])
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
        batch.create_index("ix_tokens_user_id", ["user_id"])  # no foreign key: SQLite would copy `tokens`
    with op.batch_alter_table("access") as batch:
        batch.add_column(sa.Column("max_gpus_per_user", sa.Integer(), nullable=True))
    for table in OWNED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("created_by", sa.String(length=80), nullable=True))
            batch.add_column(sa.Column("updated_by", sa.String(length=80), nullable=True))
    _owners()


def _owners() -> None:
    """Give each existing user and org_admin token its owner (see the module's docstring)."""
    conn = op.get_bind()
    users = sa.table("users", sa.column("id"), sa.column("org_id"), sa.column("name"), sa.column("kind"),
                     sa.column("display_name"), sa.column("org_admin"), sa.column("created_at"))
    roles = sa.table("user_roles", sa.column("user_id"), sa.column("workspace_id"), sa.column("role"))
    tokens = sa.table("tokens", sa.column("id"), sa.column("kind"), sa.column("org_id"), sa.column("workspace_id"),
                      sa.column("role"), sa.column("user_id"), sa.column("created_at"))
    workspaces = sa.table("workspaces", sa.column("id"), sa.column("name"))
    ws_names = dict(conn.execute(sa.select(workspaces.c.id, workspaces.c.name)).all())
    made: dict[tuple[int, str], int] = {}

    def user(org_id: int, name: str, kind: str, org_admin: bool, display: str, at: float) -> int:
        if (org_id, name) not in made:
            conn.execute(sa.insert(users).values(org_id=org_id, name=name, kind=kind, display_name=display,
                                                 org_admin=org_admin, created_at=at))  # its first token's time
            made[org_id, name] = conn.execute(sa.select(users.c.id).where(
                users.c.org_id == org_id, users.c.name == name)).scalar_one()
        return made[org_id, name]

    rows = conn.execute(sa.select(tokens.c.id, tokens.c.kind, tokens.c.org_id, tokens.c.workspace_id,
                                  tokens.c.role, tokens.c.created_at).order_by(tokens.c.id)).all()
    for tid, kind, org_id, ws_id, role, at in rows:
        if kind == "org_admin":
            uid = user(org_id, "admin", "person", True, "Organisation admin", at)
        elif kind == "user" and ws_id is not None:
            ws = ws_names.get(ws_id, str(ws_id))
            name = f"service:{ws}-{role or 'viewer'}"
            new = (org_id, name) not in made
            uid = user(org_id, name, "service", False, f"tokens of workspace {ws} ({role or 'viewer'})", at)
            if new:
                conn.execute(sa.insert(roles).values(user_id=uid, workspace_id=ws_id, role=role or "viewer"))
        else:
            continue
        conn.execute(sa.update(tokens).where(tokens.c.id == tid).values(user_id=uid))


def downgrade() -> None:
    # DROP COLUMN in place (see 0005): copying would recreate tables that other tables' foreign keys point at.
    for table in OWNED:
        with op.batch_alter_table(table, recreate="never") as batch:
            batch.drop_column("updated_by")
            batch.drop_column("created_by")
    with op.batch_alter_table("access", recreate="never") as batch:
        batch.drop_column("max_gpus_per_user")
    with op.batch_alter_table("tokens", recreate="never") as batch:
        batch.drop_index("ix_tokens_user_id")
        batch.drop_column("user_id")
    op.drop_index("ix_audit_time", table_name="audit")
    op.drop_table("audit")
    op.drop_table("user_roles")
    op.drop_table("users")
