"""The first schema.

Revision ID: 0001
Revises:
"""

from alembic import op

from astraeus.server import db

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# The tables of the first release, created from the models as they stood then. Later changes get revisions
# of their own with explicit operations (alembic revision --autogenerate against a database at this one).
TABLES = ["orgs", "clusters", "workspaces", "access", "tokens", "machines", "runs", "workers", "history", "events",
          "log_lines", "drives"]


def upgrade() -> None:
    bind = op.get_bind()
    db.Base.metadata.create_all(bind, tables=[db.Base.metadata.tables[t] for t in TABLES])


def downgrade() -> None:
    bind = op.get_bind()
    db.Base.metadata.drop_all(bind, tables=[db.Base.metadata.tables[t] for t in reversed(TABLES)])
