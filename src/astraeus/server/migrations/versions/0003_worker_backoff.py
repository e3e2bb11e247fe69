"""Crash-loop backoff: when a failed worker may restart, and how many quick failures it had in a row.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("restart_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("crash_streak", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("crash_streak")
        batch.drop_column("restart_at")
