"""Run templates, schedules (and their ticks), replica groups; where a run came from (template and version,
schedule, replica group, job array).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

RUN_COLUMNS = ("template", "template_version", "schedule_id", "group_id", "array_job", "array_index",
               "array_max_running")


def upgrade() -> None:
    op.create_table(
        "templates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workspace_id", "name"),
    )
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("last_tick", sa.Float(), nullable=True),
        sa.Column("next_tick", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workspace_id", "name"),
    )
    op.create_table(
        "schedule_ticks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("tick", sa.String(length=12), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("run_name", sa.String(length=63), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("handled_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("schedule_id", "tick"),
    )
    op.create_index("ix_schedule_ticks_schedule_id", "schedule_ticks", ["schedule_id"])
    op.create_table(
        "replica_groups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("retry_at", sa.Float(), nullable=True),
        sa.Column("serial", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workspace_id", "name"),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("template", sa.String(length=63), nullable=True))
        batch.add_column(sa.Column("template_version", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("schedule_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("group_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("array_job", sa.String(length=63), nullable=True))
        batch.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("array_max_running", sa.Integer(), nullable=True))
    op.create_index("ix_runs_schedule_id", "runs", ["schedule_id"])
    op.create_index("ix_runs_group_id", "runs", ["group_id"])
    op.create_index("ix_runs_array_job", "runs", ["array_job"])


def downgrade() -> None:
    op.drop_index("ix_runs_array_job", table_name="runs")
    op.drop_index("ix_runs_group_id", table_name="runs")
    op.drop_index("ix_runs_schedule_id", table_name="runs")
    # DROP COLUMN in place (see 0005): copying `runs` would break the foreign keys that point at it.
    with op.batch_alter_table("runs", recreate="never") as batch:
        for c in reversed(RUN_COLUMNS):
            batch.drop_column(c)
    op.drop_table("replica_groups")
    op.drop_index("ix_schedule_ticks_schedule_id", table_name="schedule_ticks")
    op.drop_table("schedule_ticks")
    op.drop_table("schedules")
    op.drop_table("templates")
