"""Disk pressure (issue 42, item 4): each machine's state-dir filesystem as its agent last reported it (path, free
and total bytes), so that a machine nearly out of disk takes no new workers and says so. NULL: an older agent, or
not reported yet.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("machines", recreate="never") as t:
        t.add_column(sa.Column("disk_path", sa.String(length=4096), nullable=True))
        t.add_column(sa.Column("disk_free_bytes", sa.BigInteger(), nullable=True))
        t.add_column(sa.Column("disk_total_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # DROP COLUMN in place (see 0005): copying would recreate a table that other tables' foreign keys point at
    with op.batch_alter_table("machines", recreate="never") as t:
        t.drop_column("disk_total_bytes")
        t.drop_column("disk_free_bytes")
        t.drop_column("disk_path")
