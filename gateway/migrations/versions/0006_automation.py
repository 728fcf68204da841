"""automation: SOP definitions, run history, Teams conversation references

Revision ID: 0006_automation
Revises: 0005_hardening
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_automation"
down_revision = "0005_hardening"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sops",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("instruction", sa.Text, nullable=False),
        sa.Column("trigger_kind", sa.String(16), nullable=False),
        sa.Column("trigger_spec", sa.JSON, nullable=False),
        sa.Column("webhook_secret", sa.Text),
        sa.Column("deliver_to", sa.String(400)),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("research", sa.Boolean, nullable=False),
        sa.Column("scope_tags", sa.JSON, nullable=False),
        sa.Column("catch_up", sa.String(8), nullable=False),
        sa.Column("origin", sa.String(8), nullable=False),
        sa.Column("next_due_at", TS),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "sop_runs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("sop_name", sa.String(64), nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("principal", sa.String(32), nullable=False),
        sa.Column("due_at", TS),
        sa.Column("idempotency_key", sa.String(200)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("held_by", sa.String(200)),
        sa.Column("reply", sa.Text),
        sa.Column("model_calls", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("delivered_to", sa.String(400)),
        sa.Column("session_id", sa.String(40)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
        # A due run is claimed by inserting its row: exactly once across processes.
        sa.UniqueConstraint("sop_name", "due_at", name="uq_sop_runs_due"),
        sa.UniqueConstraint("sop_name", "idempotency_key", name="uq_sop_runs_idempotency"),
    )
    op.create_index("ix_sop_runs_sop_created", "sop_runs", ["sop_name", "created_at"])
    op.create_index("ix_sop_runs_status", "sop_runs", ["sop_name", "status"])
    op.create_table(
        "teams_conversation_refs",
        sa.Column("conversation_id", sa.String(400), primary_key=True),
        sa.Column("reference", sa.JSON, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in ("teams_conversation_refs", "sop_runs", "sops"):
        op.drop_table(table)
