"""GPU memory and MIG devices (issue 46): each machine's per-GPU memory and MIG devices, as its agent reports them.

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL until the machine's agent registers again: runs asking GPU memory do not fit there before it does.
    with op.batch_alter_table("machines", recreate="never") as b:  # in place, as 0021: a copy breaks foreign keys
        b.add_column(sa.Column("gpu_memory", sa.JSON(), nullable=True))
        b.add_column(sa.Column("gpu_mig", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machines", recreate="never") as b:
        b.drop_column("gpu_mig")
        b.drop_column("gpu_memory")
