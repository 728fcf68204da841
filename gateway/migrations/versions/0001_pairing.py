"""pairing: users, identities, pairing requests, role changes, link codes, audit

Revision ID: 0001_pairing
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_pairing"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("display_name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "identities",
        sa.Column("channel", sa.String(32), primary_key=True),
        sa.Column("platform_user_id", sa.String(200), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("linked_at", TS, nullable=False),
    )
    op.create_index("ix_identities_user_id", "identities", ["user_id"])
    op.create_table(
        "pairing_requests",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("code", sa.String(16), nullable=False),
        sa.Column("platform_user_id", sa.String(200), nullable=False),
        sa.Column("display_name", sa.String(200), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("decided_by", sa.String(200)),
        sa.Column("decided_at", TS),
        sa.Column("user_id", sa.String(40)),
    )
    op.create_index("ix_pairing_requests_channel_status", "pairing_requests", ["channel", "status"])
    op.create_table(
        "role_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("old_role", sa.String(16)),
        sa.Column("new_role", sa.String(16), nullable=False),
        sa.Column("changed_by", sa.String(200), nullable=False),
        sa.Column("changed_at", TS, nullable=False),
    )
    op.create_index("ix_role_changes_user_id", "role_changes", ["user_id"])
    op.create_table(
        "link_codes",
        sa.Column("code", sa.String(16), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("used_at", TS),
    )
    op.create_table(
        "pairing_audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("pairing_audit", "link_codes", "role_changes", "pairing_requests", "identities", "users"):
        op.drop_table(table)
