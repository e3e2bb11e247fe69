"""Placement (issue 46): how a cluster chooses machines and GPUs, "fgd", "bestfit" (the default) or "spread".

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing clusters keep best fit, the rule they placed by before.
    with op.batch_alter_table("clusters", recreate="never") as b:  # in place, as 0021: a copy breaks foreign keys
        b.add_column(sa.Column("placement", sa.String(16), nullable=False, server_default="bestfit"))


def downgrade() -> None:
    with op.batch_alter_table("clusters", recreate="never") as b:
        b.drop_column("placement")
