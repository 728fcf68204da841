"""a lease on the message being answered: one session's messages answered in order across processes

Revision ID: 0012_answering
Revises: 0011_firsthour
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_answering"
down_revision = "0011_firsthour"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Set when a turn stores a message it will answer (and renewed while it answers); a later
    # message of the session, in any process, waits while an earlier one is under lease and
    # has no reply. An expired lease (its process died) no longer blocks. See gateway/ordering.py.
    op.add_column("messages", sa.Column("answering_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("messages", "answering_until")
