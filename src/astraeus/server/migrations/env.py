"""Alembic environment: migrations run at control-plane start-up on the connection it passes in.

The models in `astraeus.server.db` are the target. A schema change is a model edit plus a new revision in
`versions/` with explicit operations, never an edit of an old revision. Write it with autogenerate against a
database at the current head (see alembic.ini beside this file for the commands); use batch operations
(`op.batch_alter_table`) so that it also runs on SQLite. tests/migrations checks that autogenerate finds no
difference between head and the models, on SQLite and PostgreSQL.
"""

from alembic import context

from astraeus.server.db import Base, make_engine
from astraeus.server.migrations import CONTEXT_OPTIONS

target_metadata = Base.metadata


def run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, **CONTEXT_OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    run(connection)
else:  # the alembic command line: the database from -x url=... or ASTRAEUS_DATABASE_URL
    from astraeus.settings import server_settings

    url = context.get_x_argument(as_dictionary=True).get("url") or server_settings().database_url
    if not url:
        raise SystemExit("alembic: name the database with -x url=... or ASTRAEUS_DATABASE_URL")
    engine = make_engine(url)
    with engine.begin() as conn:
        run(conn)
    engine.dispose()
