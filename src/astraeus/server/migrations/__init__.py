"""The schema's alembic revisions (versions/), run at control-plane start-up by `db.migrate`."""

# How the environment configures alembic, shared with the test that autogenerate finds no difference: compare
# column types (a String(63) that becomes String(80) is a change) and server defaults, besides tables, columns,
# nullability, indexes, unique and foreign-key constraints; batch operations so that revisions run on SQLite.
CONTEXT_OPTIONS = {"compare_type": True, "compare_server_default": True, "render_as_batch": True}
