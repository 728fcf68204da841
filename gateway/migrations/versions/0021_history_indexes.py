"""two reads that grew with history seek what they want: a sender's pairing code, and the undone revisions

Revision ID: 0021_history_indexes
Revises: 0020_open_obligations
"""

import sqlalchemy as sa
from alembic import op

revision = "0021_history_indexes"
down_revision = "0020_open_obligations"
branch_labels = None
depends_on = None

# - A DM from a sender nobody paired asks for their pairing code (``PairingStore.request_code``): the
#   channel's pending requests not yet expired. An expired request stays 'pending' (the record of a
#   code nobody approved), so on (channel, status) the read walked every code that ever expired on
#   the channel, and each stranger's DM (a flood of them included) cost more than the last: 29 ms at
#   200,000 on SQLite. With expires_at in the index it seeks the live ones.
# - Every automatic distillation (every 5 minutes) reads the undone revisions, its vetoes
#   (``MemoryStore.undone_revisions``). A revision row is written for every retirement, each
#   conversation summary's included, and few are ever undone: with no index on undone_at the
#   read went through all of them (13 ms at 200,000 on SQLite). A partial index holds the undone ones.


def upgrade() -> None:
    op.drop_index("ix_pairing_requests_channel_status", table_name="pairing_requests")
    op.create_index(
        "ix_pairing_requests_channel_status_expiry", "pairing_requests", ["channel", "status", "expires_at"]
    )
    op.create_index(
        "ix_memory_revisions_undone",
        "memory_revisions",
        ["undone_at"],
        sqlite_where=sa.text("undone_at IS NOT NULL"),
        postgresql_where=sa.text("undone_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_memory_revisions_undone", table_name="memory_revisions")
    op.drop_index("ix_pairing_requests_channel_status_expiry", table_name="pairing_requests")
    op.create_index("ix_pairing_requests_channel_status", "pairing_requests", ["channel", "status"])
