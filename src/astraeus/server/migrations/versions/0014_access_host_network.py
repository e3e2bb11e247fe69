"""Per-worker networks (issue 42, item 1): whether a workspace's runs on a cluster may ask for the machine's own
network (`network: host`, which an admin allows per cluster and workspace). False for every existing grant.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("access") as t:
        t.add_column(sa.Column("host_network", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("access", recreate="never") as t:  # in place, as 0013
        t.drop_column("host_network")
