"""Pools of machines, reservations, and the pools a workspace may use on a cluster.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("machines", sa.JSON(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster_id", "name"),
    )
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("org_id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("workspaces", sa.JSON(), nullable=False),
        sa.Column("machines", sa.JSON(), nullable=False),
        sa.Column("pool", sa.String(length=63), nullable=True),
        sa.Column("count", sa.Integer(), nullable=True),
        sa.Column("start_at", sa.Float(), nullable=False),
        sa.Column("end_at", sa.Float(), nullable=True),
        sa.Column("opened", sa.Boolean(), nullable=False),
        sa.Column("closed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"]),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("org_id", "name"),
    )
    op.create_index(op.f("ix_reservations_cluster_id"), "reservations", ["cluster_id"], unique=False)
    with op.batch_alter_table("access") as batch:
        batch.add_column(sa.Column("pools", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("access") as batch:
        batch.drop_column("pools")
    op.drop_index(op.f("ix_reservations_cluster_id"), table_name="reservations")
    op.drop_table("reservations")
    op.drop_table("pools")
