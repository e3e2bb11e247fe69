"""Registry credentials per workspace; the runtime a machine's agent runs workers with.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_credentials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("username", sa.String(length=255), nullable=False),
        sa.Column("password", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workspace_id", "host"),
    )
    with op.batch_alter_table("machines") as batch:
        batch.add_column(sa.Column("runtime", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch's copy-and-move: copying would drop and recreate
    # `machines`, which the foreign keys of workers and tokens forbid while they hold rows.
    with op.batch_alter_table("machines", recreate="never") as batch:
        batch.drop_column("runtime")
    op.drop_table("registry_credentials")
