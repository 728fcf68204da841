"""dashboard logouts kept in the database: a logged-out cookie is refused by every process, after restarts too

Revision ID: 0014_operator_logouts
Revises: 0013_term_ranking
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_operator_logouts"
down_revision = "0013_term_ranking"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # The operator's session cookie is stateless (signed with a key derived from the dashboard
    # token); its logout was a set in one process's memory, so another process, or the same one
    # restarted, took the cookie again until it expired. A row per logout, kept until then.
    op.create_table(
        "operator_logouts",
        sa.Column("nonce", sa.String(64), primary_key=True),
        sa.Column("logged_out_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("operator_logouts")
