"""Single sign-on (issue 45): an organisation's OpenID Connect provider, sign-ins in progress, users' subjects.

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One provider per organisation: where it is, the console's and the CLI's clients, how users and roles map.
    op.create_table(
        "sso_providers",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("org_id", sa.Integer(), sa.ForeignKey("orgs.id"), nullable=False, unique=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("issuer", sa.String(500), nullable=False),
        sa.Column("client_id", sa.String(200), nullable=False),
        sa.Column("client_secret", sa.String(500), nullable=True),
        sa.Column("cli_client_id", sa.String(200), nullable=True),
        sa.Column("match_by", sa.String(16), nullable=False, server_default="sub"),
        sa.Column("groups_claim", sa.String(100), nullable=False, server_default="groups"),
        sa.Column("roles", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    # A console sign-in between the redirect to the provider and its callback: the state's digest, PKCE verifier.
    op.create_table(
        "sso_logins",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("state", sa.String(64), nullable=False, unique=True),
        sa.Column("org_id", sa.Integer(), sa.ForeignKey("orgs.id"), nullable=False),
        sa.Column("verifier", sa.String(128), nullable=False),
        sa.Column("nonce", sa.String(64), nullable=False),
        sa.Column("next", sa.String(500), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    # The provider's `sub` of a user signed in by single sign-on.
    op.add_column("users", sa.Column("sso_subject", sa.String(255), nullable=True))


def downgrade() -> None:
    op.drop_column("users", "sso_subject")  # in place (SQLite too): a copy of users would break its references
    op.drop_table("sso_logins")
    op.drop_table("sso_providers")
