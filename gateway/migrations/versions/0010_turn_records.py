"""turn records for the dashboard's "explain a turn", and the indexes its memory pages page through

Revision ID: 0010_turn_records
Revises: 0009_idle_extraction
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_turn_records"
down_revision = "0009_idle_extraction"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # One row per answered turn, written in the reply's transaction: what its prompt held.
    op.create_table(
        "turn_records",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(40), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("message_id", sa.String(300), nullable=False),
        sa.Column("reply_message_id", sa.String(300), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("speaker_user_id", sa.String(40)),
        sa.Column("stored_role", sa.String(32)),
        sa.Column("memory", sa.JSON, nullable=False),
        sa.Column("sections", sa.JSON, nullable=False),
        sa.Column("model_calls", sa.JSON, nullable=False),
    )
    op.create_index("ix_turn_records_session", "turn_records", ["session_id", "id"])
    op.create_index("ix_turn_records_reply_message_id", "turn_records", ["reply_message_id"])
    # The dashboard pages memory newest-said first (keyset on said_at, id), across all scopes or one status.
    op.create_index("ix_memory_records_said_at", "memory_records", ["said_at", "id"])
    op.create_index("ix_memory_records_status_said_at", "memory_records", ["status", "said_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_memory_records_status_said_at", "memory_records")
    op.drop_index("ix_memory_records_said_at", "memory_records")
    op.drop_table("turn_records")
