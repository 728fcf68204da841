"""sessions, messages, archives, jobs

Revision ID: 0002_sessions
Revises: 0001_pairing
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_sessions"
down_revision = "0001_pairing"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("conversation_id", sa.String(300), nullable=False),
        sa.Column("thread_id", sa.String(300), nullable=False),
        sa.Column("parent_conversation_id", sa.String(300)),
        sa.Column("previous_context", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("channel", "conversation_id", "thread_id", name="uq_sessions_key"),
    )
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(40), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("platform_message_id", sa.String(300), nullable=False),
        sa.Column("speaker_user_id", sa.String(40)),
        sa.Column("stored_role", sa.String(32)),
        sa.Column("display_name", sa.String(200), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("said_at", TS, nullable=False),
        sa.Column("is_agent", sa.Boolean, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("archive_id", sa.String(40)),
        sa.UniqueConstraint("session_id", "platform_message_id", name="uq_messages_platform_id"),
    )
    op.create_index("ix_messages_session_live", "messages", ["session_id", "archive_id", "id"])
    op.create_table(
        "archives",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("session_id", sa.String(40), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("start_at", TS, nullable=False),
        sa.Column("end_at", TS, nullable=False),
        sa.Column("trust", sa.String(16), nullable=False),
        sa.Column("message_count", sa.Integer, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("markdown", sa.Text, nullable=False),
    )
    op.create_index("ix_archives_session_id", "archives", ["session_id"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("run_after", TS, nullable=False),
        sa.Column("locked_by", sa.String(64)),
        sa.Column("locked_at", TS),
        sa.Column("last_error", sa.Text),
        sa.Column("raw_answer", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("finished_at", TS),
    )
    op.create_index("ix_jobs_claim", "jobs", ["status", "run_after"])


def downgrade() -> None:
    for table in ("jobs", "archives", "messages", "sessions"):
        op.drop_table(table)
