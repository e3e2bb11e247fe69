"""Logs at scale (issue 19): each worker's log size kept as a running count (table log_usage, filled from the lines
already kept), so that storing a batch of lines checks the worker's log limits without counting its rows; and an
index on log_lines (worker_id, id) for reading a worker's lines in order (a follower's next lines, trimming).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "log_usage",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Integer(), nullable=False),
        sa.Column("lines", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["worker_id"], ["workers.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("worker_id"),
    )
    size = ("octet_length(text) + 1" if op.get_bind().dialect.name == "postgresql"
            else "length(CAST(text AS BLOB)) + 1")
    op.execute(f"INSERT INTO log_usage (worker_id, lines, bytes) SELECT worker_id, count(*), sum({size}) "
               "FROM log_lines WHERE attempt >= 0 GROUP BY worker_id")
    op.create_index("ix_log_lines_worker", "log_lines", ["worker_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_log_lines_worker", table_name="log_lines")
    op.drop_table("log_usage")
