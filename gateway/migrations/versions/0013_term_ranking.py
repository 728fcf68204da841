"""memory_terms postings carry their note's said_at and review_by: the prompt's match ranks from postings alone

Revision ID: 0013_term_ranking
Revises: 0012_answering
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_term_ranking"
down_revision = "0012_answering"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Joining every posting of the conversation's words to its record (a primary-key lookup and
    # a row read each, ~1,250 of them at 100,000 records) was most of a turn's memory read. With
    # the two values ranking and the current-note filter need on the posting (both fixed once a
    # record is written), the best notes are chosen on one covering index and only those are read.
    with op.batch_alter_table("memory_terms") as batch:
        batch.add_column(sa.Column("said_at", TS, nullable=True))
        batch.add_column(sa.Column("review_by", TS, nullable=True))
    op.execute(
        "UPDATE memory_terms SET"
        " said_at = (SELECT r.said_at FROM memory_records r WHERE r.id = memory_terms.record_id),"
        " review_by = (SELECT r.review_by FROM memory_records r WHERE r.id = memory_terms.record_id)"
    )
    with op.batch_alter_table("memory_terms") as batch:
        batch.alter_column("said_at", existing_type=TS, nullable=False)
    op.create_index("ix_memory_terms_rank", "memory_terms", ["term", "record_id", "said_at", "review_by"])


def downgrade() -> None:
    op.drop_index("ix_memory_terms_rank", table_name="memory_terms")
    with op.batch_alter_table("memory_terms") as batch:
        batch.drop_column("review_by")
        batch.drop_column("said_at")
