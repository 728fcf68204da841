"""hardening: replies in their own namespace, reply requested, a heartbeat row for readiness

Revision ID: 0005_hardening
Revises: 0004_memory_time

- ``messages.reply_to_id`` links the agent's reply to the message it answers; a
  unique index makes "one reply per message" structural, and the inbound id's
  uniqueness is now scoped by ``is_agent`` so no client id (whatever a channel's
  alphabet allows) can collide with a reply's id.
- ``messages.reply_requested``: whether the sender asked for an answer (a group
  message that did not mention the bot is store-only), so a retry or a restart
  knows what is still owed.
- ``gateway_heartbeat``: one row per process, updated by ``/readyz`` to prove
  that writes work.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_hardening"
down_revision = "0004_memory_time"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("reply_to_id", sa.Integer, nullable=True))
        batch.add_column(sa.Column("reply_requested", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.drop_constraint("uq_messages_platform_id", type_="unique")
        batch.create_unique_constraint("uq_messages_platform_id", ["session_id", "is_agent", "platform_message_id"])
        batch.create_foreign_key("fk_messages_reply_to", "messages", ["reply_to_id"], ["id"], ondelete="CASCADE")
    op.create_index("uq_messages_reply_to", "messages", ["reply_to_id"], unique=True)
    # Replies stored before this revision were named "<message id>:reply": link them.
    op.execute(
        """
        UPDATE messages SET reply_to_id = (
            SELECT m.id FROM messages AS m
            WHERE m.session_id = messages.session_id AND m.is_agent = false
              AND messages.platform_message_id = m.platform_message_id || '\\:reply'
        )
        WHERE is_agent = true
        """
    )
    op.execute(
        "UPDATE messages SET reply_requested = true WHERE is_agent = false AND EXISTS "
        "(SELECT 1 FROM messages AS r WHERE r.reply_to_id = messages.id)"
    )
    op.create_table(
        "gateway_heartbeat",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gateway_heartbeat")
    op.drop_index("uq_messages_reply_to", "messages")
    with op.batch_alter_table("messages") as batch:
        batch.drop_constraint("fk_messages_reply_to", type_="foreignkey")
        batch.drop_constraint("uq_messages_platform_id", type_="unique")
        batch.create_unique_constraint("uq_messages_platform_id", ["session_id", "platform_message_id"])
        batch.drop_column("reply_requested")
        batch.drop_column("reply_to_id")
