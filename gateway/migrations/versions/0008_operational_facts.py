"""operational facts: why a record was held for review, a note's scope and what its writer cited

Revision ID: 0008_operational_facts
Revises: 0007_identity_intelligence
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_operational_facts"
down_revision = "0007_identity_intelligence"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Why the gate wrote a record as unverified (e.g. an operational item carrying personal data).
    op.add_column("memory_records", sa.Column("status_reason", sa.Text, nullable=True))
    # agent_notes: the SOP names / tags a fact is for (NULL: every conversation and run).
    op.add_column("memory_records", sa.Column("applies_to", sa.JSON, nullable=True))
    # What the writer cited (a model's or person's references), kept apart from the host-stamped evidence.
    op.add_column("memory_records", sa.Column("citations", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("memory_records") as batch:
        batch.drop_column("citations")
        batch.drop_column("applies_to")
        batch.drop_column("status_reason")
