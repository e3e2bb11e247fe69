"""Alembic environment: migrations run at control-plane start-up on the connection it passes in."""

from alembic import context

from astraeus.server.db import Base

target_metadata = Base.metadata
connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
