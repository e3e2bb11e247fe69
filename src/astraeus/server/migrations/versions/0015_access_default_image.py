"""A site's default image (issue 44): the image a workspace's runs on a cluster use when they name none (a batch
script as written names none). Null for every existing grant: runs still name their image.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("access") as t:
        t.add_column(sa.Column("default_image", sa.String(512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("access", recreate="never") as t:  # in place, as 0014
        t.drop_column("default_image")
