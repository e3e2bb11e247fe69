"""Hung runs and the least work lost (issue 47): progress and checkpoint reports of workers.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A worker's last progress (time and text, e.g. "step 1234") and last checkpoint, as its agent or its log lines
    # report them; stalled_at: when the control plane last found it stalled (the event fires once per stall).
    with op.batch_alter_table("workers", recreate="never") as b:
        b.add_column(sa.Column("progress_at", sa.Float(), nullable=True))
        b.add_column(sa.Column("progress_text", sa.String(200), nullable=True))
        b.add_column(sa.Column("checkpoint_at", sa.Float(), nullable=True))
        b.add_column(sa.Column("stalled_at", sa.Float(), nullable=True))
    # Which victims of equal priority preemption stops first: "recent" (the pages' rule) or "least-work-lost".
    with op.batch_alter_table("clusters", recreate="never") as b:
        b.add_column(sa.Column("preemption_victims", sa.String(24), nullable=False, server_default="recent"))


def downgrade() -> None:
    # DROP COLUMN in place (see 0005): copying would recreate tables that other tables' foreign keys point at.
    with op.batch_alter_table("clusters", recreate="never") as b:
        b.drop_column("preemption_victims")
    with op.batch_alter_table("workers", recreate="never") as b:
        for name in ("stalled_at", "checkpoint_at", "progress_text", "progress_at"):
            b.drop_column(name)
