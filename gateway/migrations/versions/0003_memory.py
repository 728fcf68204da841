"""memory: records, revisions (every retirement), and the live-notes term index

Revision ID: 0003_memory
Revises: 0002_sessions
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_memory"
down_revision = "0002_sessions"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "memory_records",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("owner_user_id", sa.String(40)),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("subject_key", sa.String(200), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("said_at", TS, nullable=False),
        sa.Column("recorded_at", TS, nullable=False),
        sa.Column("review_by", TS),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("author_user_id", sa.String(40)),
        sa.Column("author_role", sa.String(32)),
        sa.Column("session_id", sa.String(200)),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("run_id", sa.String(40)),
        sa.Column("superseded_by", sa.String(40)),
    )
    op.create_index(
        "ix_memory_records_scope_owner_status", "memory_records", ["scope", "owner_user_id", "status", "said_at"]
    )
    op.create_index("ix_memory_records_scope_subject_status", "memory_records", ["scope", "subject_key", "status"])
    op.create_table(
        "memory_revisions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("retired_id", sa.String(40), sa.ForeignKey("memory_records.id"), nullable=False),
        sa.Column("replacing_id", sa.String(40), sa.ForeignKey("memory_records.id")),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("via", sa.String(24), nullable=False),
        sa.Column("cause", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(40)),
        sa.Column("judge_model", sa.String(200)),
        sa.Column("prompt_version", sa.String(40)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("undone_at", TS),
        sa.Column("undone_by", sa.String(200)),
    )
    op.create_index("ix_memory_revisions_retired_id", "memory_revisions", ["retired_id"])
    op.create_index("ix_memory_revisions_replacing_id", "memory_revisions", ["replacing_id"])
    op.create_index("ix_memory_revisions_run_id", "memory_revisions", ["run_id"])
    op.create_table(
        "memory_terms",
        sa.Column("term", sa.String(64), primary_key=True),
        sa.Column("record_id", sa.String(40), sa.ForeignKey("memory_records.id", ondelete="CASCADE"), primary_key=True),
    )
    op.create_index("ix_memory_terms_record_id", "memory_terms", ["record_id"])


def downgrade() -> None:
    for table in ("memory_terms", "memory_revisions", "memory_records"):
        op.drop_table(table)
