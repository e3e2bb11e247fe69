"""Long queues on PostgreSQL (issue 19): runs and workers keep 30 % of each table page free (fillfactor 70), so that
the scheduler's rewrite of every waiting run's queue reason and every waiting worker's why-not lines when the head
changes puts each row's new version on its own page without touching the indexes (a HOT update: neither column is
indexed), instead of a new version elsewhere and an entry in each of the table's indexes. Pages written before the
upgrade keep their rows; the setting applies to the pages written from now on (no table rewrite: the upgrade takes
no lock beyond a moment's). SQLite has no such setting: a no-op there.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TABLES = ("runs", "workers")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
