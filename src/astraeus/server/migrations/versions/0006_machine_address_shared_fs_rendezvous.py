"""The fleet: a machine's address, shared filesystems and NFS abilities; a gang attempt's rendezvous.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.add_column(sa.Column("address", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("shared_filesystems", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("nfs", sa.JSON(), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("rendezvous", sa.JSON(), nullable=True))


def downgrade() -> None:
    # DROP COLUMN in place (see 0005): copying would recreate tables that other tables' foreign keys point at.
    with op.batch_alter_table("workers", recreate="never") as batch:
        batch.drop_column("rendezvous")
    with op.batch_alter_table("machines", recreate="never") as batch:
        batch.drop_column("nfs")
        batch.drop_column("shared_filesystems")
        batch.drop_column("address")
