"""NVLink islands and MIG devices (issue 46): each machine's GPUs joined by NVLink or one NVSwitch, as its agent
reports them; the MIG devices each worker holds.

Revision ID: 0025
Revises: 0024
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL (one island: any of its GPUs together) until the machine's agent registers again.
    with op.batch_alter_table("machines", recreate="never") as b:  # in place, as 0021: a copy breaks foreign keys
        b.add_column(sa.Column("nvlink_islands", sa.JSON(), nullable=True))
    with op.batch_alter_table("workers", recreate="never") as b:  # NULL: no MIG devices (every worker before it)
        b.add_column(sa.Column("mig_devices", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers", recreate="never") as b:
        b.drop_column("mig_devices")
    with op.batch_alter_table("machines", recreate="never") as b:
        b.drop_column("nvlink_islands")
