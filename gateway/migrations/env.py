"""Alembic environment: runs on the connection goclaw hands it (see gateway.db.upgrade)."""

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with 'goclaw db upgrade', which supplies the connection")

context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
