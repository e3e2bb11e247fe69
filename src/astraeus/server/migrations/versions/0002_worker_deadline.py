"""Time limits: a deadline per worker attempt, indexed.

Revision ID: 0002
Revises: 0001

Idempotent: until this revision existed, 0001 built the schema from the current models, so a database made by
a release after the column was added (but stamped 0001) already has `workers.deadline` and its index, while one
made before lacks both. Look, and add only what is missing.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    columns = {c["name"] for c in inspector.get_columns("workers")}
    indexes = {ix["name"] for ix in inspector.get_indexes("workers")}
    with op.batch_alter_table("workers") as batch:
        if "deadline" not in columns:
            batch.add_column(sa.Column("deadline", sa.Float(), nullable=True))
        if "ix_workers_deadline" not in indexes:
            batch.create_index("ix_workers_deadline", ["deadline"], unique=False)


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch's copy-and-move: copying would drop and recreate
    # `workers`, which the foreign keys of log_lines forbid while they hold rows.
    with op.batch_alter_table("workers", recreate="never") as batch:
        batch.drop_index("ix_workers_deadline")
        batch.drop_column("deadline")
