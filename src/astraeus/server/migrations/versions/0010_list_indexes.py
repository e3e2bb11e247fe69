"""Indexes for listing a workspace's runs a page at a time, newest first (issue 19): the keyset query of
`GET $API/runs` (and the console's runs page) is an index scan with 100,000 runs in the workspace, with or without
a state filter.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_list", "runs", ["workspace_id", "live_key", "created_at", "id"])
    op.create_index("ix_runs_list_state", "runs", ["workspace_id", "live_key", "state", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_runs_list_state", table_name="runs")
    op.drop_index("ix_runs_list", table_name="runs")
