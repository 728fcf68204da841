"""memory over time: the retired record's prior status on revisions, and the review log

Revision ID: 0004_memory_time
Revises: 0003_memory
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_memory_time"
down_revision = "0003_memory"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # An undo returns the retired record to what it was (live, or unverified), not always to live.
    op.add_column("memory_revisions", sa.Column("prior_status", sa.String(16)))
    # Who confirmed, rejected or retracted a record, when and why: append-only.
    op.create_table(
        "memory_reviews",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("record_id", sa.String(40), sa.ForeignKey("memory_records.id"), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("by_user_id", sa.String(200), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_index("ix_memory_reviews_record_id", "memory_reviews", ["record_id"])


def downgrade() -> None:
    op.drop_table("memory_reviews")
    with op.batch_alter_table("memory_revisions") as batch:
        batch.drop_column("prior_status")
