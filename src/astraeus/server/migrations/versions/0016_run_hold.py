"""Held runs (issue 44): `scontrol hold/release`. A held run stays Pending and is never offered to the scheduler
until released. False for every existing run.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as t:  # in place: a copy of `runs` would break workers'
        t.add_column(sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as t:  # in place, as 0014
        t.drop_column("held")
