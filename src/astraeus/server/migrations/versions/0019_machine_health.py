"""A fleet that heals (issue 47): cordoned and drained machines with their reasons, quarantined GPUs.

Each machine gets its cordon (NULL: takes work; "cordon": takes no new work; "drain": neither, and what ran there
was stopped), why and by whom ("admin" or "health-check": a health-check drain ends when the check passes again),
since when, and its failed GPUs ({index: {"what": "XID 79", "xid": 79, "at": ...}}: quarantined until an admin
clears them). NULL: none.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("machines", recreate="never") as t:
        t.add_column(sa.Column("cordon", sa.String(length=16), nullable=True))
        t.add_column(sa.Column("cordon_reason", sa.String(length=500), nullable=True))
        t.add_column(sa.Column("cordon_by", sa.String(length=16), nullable=True))
        t.add_column(sa.Column("cordon_at", sa.Float(), nullable=True))
        t.add_column(sa.Column("gpu_faults", sa.JSON(), nullable=True))


def downgrade() -> None:
    # DROP COLUMN in place (see 0005): copying would recreate a table that other tables' foreign keys point at
    with op.batch_alter_table("machines", recreate="never") as t:
        t.drop_column("gpu_faults")
        t.drop_column("cordon_at")
        t.drop_column("cordon_by")
        t.drop_column("cordon_reason")
        t.drop_column("cordon")
