"""the one-reply-per-message index holds replies only: a person's message (no reply_to_id) is not in it

Revision ID: 0016_reply_index_partial
Revises: 0015_messages_append_only
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_reply_index_partial"
down_revision = "0015_messages_append_only"
branch_labels = None
depends_on = None

# Half the rows of messages are people's, whose reply_to_id is NULL: the full index gave each of
# them an entry no lookup ever finds (NULLs are distinct, and every read is reply_to_id = ?), and
# each turn's first commit wrote that index's page to the WAL for nothing. Every read of the
# index (a retry's stored reply, the unanswered scan's LEFT JOIN, the foreign key's cascade) has
# reply_to_id = ?, which implies the predicate on both databases, so the partial index serves
# them all; ON CONFLICT DO NOTHING (a reply stored twice) names no target and still sees it.
PREDICATE = "reply_to_id IS NOT NULL"


def upgrade() -> None:
    op.drop_index("uq_messages_reply_to", table_name="messages")
    op.create_index(
        "uq_messages_reply_to",
        "messages",
        ["reply_to_id"],
        unique=True,
        sqlite_where=sa.text(PREDICATE),
        postgresql_where=sa.text(PREDICATE),
    )


def downgrade() -> None:
    op.drop_index("uq_messages_reply_to", table_name="messages")
    op.create_index("uq_messages_reply_to", "messages", ["reply_to_id"], unique=True)
