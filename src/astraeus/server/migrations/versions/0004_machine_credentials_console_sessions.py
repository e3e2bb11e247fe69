"""Machine credentials bound to their machine; console sessions apart from API tokens.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("machine_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_tokens_machine_id", "machines", ["machine_id"], ["id"])
        batch.create_index("ix_tokens_machine_id", ["machine_id"])
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["tokens.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    op.create_index("ix_console_sessions_token_id", "console_sessions", ["token_id"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_token_id", table_name="console_sessions")
    op.drop_table("console_sessions")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_index("ix_tokens_machine_id")
        batch.drop_constraint("fk_tokens_machine_id", type_="foreignkey")
        batch.drop_column("machine_id")
