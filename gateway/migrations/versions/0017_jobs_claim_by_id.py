"""the job claim's index orders by id: the oldest runnable job is found without sorting every pending one

Revision ID: 0017_jobs_claim_by_id
Revises: 0016_reply_index_partial
"""

from alembic import op

revision = "0017_jobs_claim_by_id"
down_revision = "0016_reply_index_partial"
branch_labels = None
depends_on = None

# A claim takes the oldest runnable job: ORDER BY id LIMIT 1 over the pending jobs that are due (and
# the running ones whose lease ran out). On (status, run_after) both databases read every due pending
# job and sorted them to take one, so a worker with a queue of N jobs paid O(N) a claim and O(N^2)
# for the queue, on SQLite inside the write lock the turns wait for (bench/job_drain.py: 0.08 ms a
# job with 500 queued, 1.31 ms with 16,000). On (status, id) each part of the claim walks its status
# in id order and stops at the first row it can take.


def upgrade() -> None:
    op.drop_index("ix_jobs_claim", table_name="jobs")
    op.create_index("ix_jobs_claim", "jobs", ["status", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_claim", table_name="jobs")
    op.create_index("ix_jobs_claim", "jobs", ["status", "run_after"])
