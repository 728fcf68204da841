"""the person being paired: where they asked from, and an outbox of messages telling them they are paired

Revision ID: 0011_firsthour
Revises: 0010_turn_records
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_firsthour"
down_revision = "0010_turn_records"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # The conversation a pairing code was asked for in (a Discord DM channel, a Teams
    # conversation): where the person is told they are paired.
    op.add_column("pairing_requests", sa.Column("conversation_id", sa.String(200)))
    # Written in the approve transaction; delivered by a running gateway through the
    # channel's adapter, whichever process approved (CLI, DM command, dashboard).
    op.create_table(
        "pairing_notices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("platform_user_id", sa.String(200), nullable=False),
        sa.Column("conversation_id", sa.String(200)),
        sa.Column("user_id", sa.String(40), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("claimed_at", TS),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("done_at", TS),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_pairing_notices_status", "pairing_notices", ["status", "channel"])


def downgrade() -> None:
    op.drop_table("pairing_notices")
    with op.batch_alter_table("pairing_requests") as batch:
        batch.drop_column("conversation_id")
