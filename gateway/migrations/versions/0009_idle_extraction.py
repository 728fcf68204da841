"""idle extraction: each session's "extracted through" mark

Revision ID: 0009_idle_extraction
Revises: 0007_identity_intelligence
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_idle_extraction"
down_revision = "0007_identity_intelligence"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The id of the newest message whose extraction job is written: the idle sweep and the
    # trim each extract only what lies after it, so no message is extracted twice.
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("extracted_through", sa.Integer, nullable=False, server_default="0"))
    # Messages trimmed before this revision were extracted by their trim's job already.
    op.execute(
        "UPDATE sessions SET extracted_through = COALESCE("
        "(SELECT MAX(m.id) FROM messages m WHERE m.session_id = sessions.id AND m.archive_id IS NOT NULL), 0)"
    )


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("extracted_through")
