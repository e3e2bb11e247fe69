"""Fractional GPUs (issue 46): a worker's share of one GPU, and who may share a GPU on a cluster.

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Thousandths of its one GPU a fractional worker shares (gpus is then 1); 0: its GPUs whole.
    with op.batch_alter_table("workers", recreate="never") as b:  # in place: a copy of `workers` breaks log_lines'
        b.add_column(sa.Column("gpu_milli", sa.Integer(), nullable=False, server_default="0"))
    # Who may share a GPU: "workspace" (tenants of one workspace only, the default) or "any".
    with op.batch_alter_table("clusters", recreate="never") as b:
        b.add_column(sa.Column("gpu_sharing", sa.String(16), nullable=False, server_default="workspace"))


def downgrade() -> None:
    with op.batch_alter_table("clusters", recreate="never") as b:  # in place, as 0014: a copy breaks foreign keys
        b.drop_column("gpu_sharing")
    with op.batch_alter_table("workers", recreate="never") as b:
        b.drop_column("gpu_milli")
