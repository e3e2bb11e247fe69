"""Usage records (issue 45): one per worker attempt, kept after runs are deleted.

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # No foreign key to runs, workers or machines: a record outlives them (names are copied in).
    op.create_table(
        "usage_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("org_id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("workspace", sa.String(length=63), nullable=False),
        sa.Column("cluster", sa.String(length=63), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("run_uid", sa.String(length=32), nullable=False),
        sa.Column("run", sa.String(length=63), nullable=False),
        sa.Column("worker", sa.String(length=80), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=80), nullable=True),
        sa.Column("pool", sa.String(length=63), nullable=True),
        sa.Column("machine", sa.String(length=63), nullable=True),
        sa.Column("gpu_model", sa.String(length=128), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("cpu_cores", sa.Float(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=False),
        sa.Column("wait_seconds", sa.Float(), nullable=False),
        sa.Column("restart_at", sa.Float(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("preempted_by", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_usage_records_workspace", "usage_records", ["workspace_id", "ended_at"], unique=False)
    op.create_index("ix_usage_records_org", "usage_records", ["org_id", "ended_at"], unique=False)
    op.create_index("ix_usage_records_run", "usage_records", ["run_id", "worker"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_usage_records_run", table_name="usage_records")
    op.drop_index("ix_usage_records_org", table_name="usage_records")
    op.drop_index("ix_usage_records_workspace", table_name="usage_records")
    op.drop_table("usage_records")
