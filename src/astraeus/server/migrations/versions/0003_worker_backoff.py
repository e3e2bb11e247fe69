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
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch's copy-and-move: copying would drop and recreate
    # `workers`, which the foreign keys of log_lines forbid while they hold rows.
    with op.batch_alter_table("workers", recreate="never") as batch:
        batch.drop_column("crash_streak")
        batch.drop_column("restart_at")
