"""the subject index leads with the owner: a write reads one person's records on its subject, not everyone's

Revision ID: 0018_subject_index_owner
Revises: 0017_jobs_claim_by_id
"""

from alembic import op

revision = "0018_subject_index_owner"
down_revision = "0017_jobs_claim_by_id"
branch_labels = None
depends_on = None

# Every gated write reads its subject first (``memory.store._same_subject_statement``: the live and
# unverified records, and the same saying in any status), and a live one then applies the subject
# rule (``_other_live_statement``). Both name the owner (NULL for the shared scopes), but the index
# was (scope, subject_key, status): personal subjects are shared by name ("timezone", each
# extraction's "conversation summary"), so the read fetched every person's records on the subject,
# history included, to keep one person's, and a write cost more as the organisation grew
# (bench/memory_write.py on SQLite: 1.2 / 5.0 / 14.5 ms a write at 20,000 / 100,000 / 300,000
# records, against about 0.5 ms at each on this index). Leading with the owner,
# and carrying status and said_at, the read seeks one person's records on the subject and tests
# the rest in the index; the subject rule and ``live_on_subject`` seek their live ones.


def upgrade() -> None:
    op.drop_index("ix_memory_records_scope_subject_status", table_name="memory_records")
    op.create_index(
        "ix_memory_records_subject", "memory_records", ["scope", "subject_key", "owner_user_id", "status", "said_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_memory_records_subject", table_name="memory_records")
    op.create_index("ix_memory_records_scope_subject_status", "memory_records", ["scope", "subject_key", "status"])
