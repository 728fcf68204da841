"""the job worker deletes the index terms of notes past their review-by date: an index to find them by

Revision ID: 0022_terms_review_by
Revises: 0021_history_indexes
"""

from alembic import op

revision = "0022_terms_review_by"
down_revision = "0021_history_indexes"
branch_labels = None
depends_on = None

# Each turn's match walks the postings of its words in memory_terms and drops those of notes
# past their review-by date one by one. An expired note stays 'live' (a fact still true is
# recorded again, which retires it), so its postings stayed, and a turn cost more with every note
# an organisation let expire (bench/memory_prompt.py --expired). The job worker now deletes them
# when idle (MemoryStore.prune_expired_postings), finding them on this index; the records stay.


def upgrade() -> None:
    op.create_index("ix_memory_terms_review_by", "memory_terms", ["review_by"])


def downgrade() -> None:
    op.drop_index("ix_memory_terms_review_by", table_name="memory_terms")
