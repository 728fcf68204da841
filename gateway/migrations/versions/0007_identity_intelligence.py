"""identity by decision, intelligence signals, routing and obligations (seed 001)

Revision ID: 0007_identity_intelligence
Revises: 0006_automation

Identity records that exist already were written directly by an admin's
``memory_write``; each gets a ``direct`` row in ``identity_decisions`` so the
record of how identity came to be is complete (the records are not touched).
"""

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0007_identity_intelligence"
down_revision = "0006_automation"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "identity_proposals",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("rationale", sa.Text, nullable=False),
        sa.Column("proposer", sa.String(200), nullable=False),
        sa.Column("proposer_role", sa.String(32)),
        sa.Column("run_id", sa.String(64)),
        sa.Column("sop_name", sa.String(200)),
        sa.Column("session_id", sa.String(200)),
        sa.Column("message_id", sa.String(200)),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_identity_proposals_created_at", "identity_proposals", ["created_at"])
    op.create_table(
        "identity_decisions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("proposal_id", sa.String(40), sa.ForeignKey("identity_proposals.id")),
        sa.Column("record_id", sa.String(40), sa.ForeignKey("memory_records.id")),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("by_user_id", sa.String(200), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("rationale", sa.Text, nullable=False),
    )
    op.create_index("ix_identity_decisions_proposal_id", "identity_decisions", ["proposal_id"], unique=True)
    op.create_index("ix_identity_decisions_record_id", "identity_decisions", ["record_id"])
    op.create_table(
        "intelligence_signals",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("sop_name", sa.String(200), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("reporter", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("claim", sa.Text, nullable=False),
        sa.Column("observation", sa.Text, nullable=False),
        sa.Column("rationale", sa.Text, nullable=False),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("confidence", sa.String(8), nullable=False),
        sa.Column("reported_severity", sa.String(16), nullable=False),
        sa.Column("affected_sops", sa.JSON, nullable=False),
        sa.Column("observed_at", TS, nullable=False),
        sa.Column("expires_at", TS),
        sa.Column("recorded_at", TS, nullable=False),
    )
    op.create_index("ix_intelligence_signals_recorded_at", "intelligence_signals", ["recorded_at"])
    op.create_table(
        "signal_routings",
        sa.Column("signal_id", sa.String(40), sa.ForeignKey("intelligence_signals.id"), primary_key=True),
        sa.Column("routed_at", TS, nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("floors", sa.JSON, nullable=False),
    )
    op.create_table(
        "obligations",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("signal_id", sa.String(40), sa.ForeignKey("intelligence_signals.id"), nullable=False),
        sa.Column("sop_name", sa.String(200), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("blocks", sa.Boolean, nullable=False),
        sa.Column("opened_at", TS, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_index("ix_obligations_signal_id", "obligations", ["signal_id"])
    op.create_index("ix_obligations_sop_name", "obligations", ["sop_name"])
    op.create_table(
        "obligation_dispositions",
        sa.Column("obligation_id", sa.String(40), sa.ForeignKey("obligations.id"), primary_key=True),
        sa.Column("disposition", sa.String(24), nullable=False),
        sa.Column("by_user_id", sa.String(200), nullable=False),
        sa.Column("by_role", sa.String(32), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("rationale", sa.Text, nullable=False),
    )

    # Identity written before this revision: marked as written directly, by its author, when it was recorded.
    conn = op.get_bind()
    records = sa.table(
        "memory_records",
        sa.column("id", sa.String),
        sa.column("scope", sa.String),
        sa.column("author_user_id", sa.String),
        sa.column("recorded_at", TS),
    )
    decisions = sa.table(
        "identity_decisions",
        sa.column("id", sa.String),
        sa.column("proposal_id", sa.String),
        sa.column("record_id", sa.String),
        sa.column("decision", sa.String),
        sa.column("by_user_id", sa.String),
        sa.column("at", TS),
        sa.column("rationale", sa.Text),
    )
    rows = conn.execute(
        sa.select(records.c.id, records.c.author_user_id, records.c.recorded_at).where(
            records.c.scope.in_(("global", "agent_config"))
        )
    ).all()
    if rows:
        conn.execute(
            decisions.insert(),
            [
                {
                    "id": "id_" + secrets.token_hex(8),
                    "proposal_id": None,
                    "record_id": rid,
                    "decision": "direct",
                    "by_user_id": author or "unknown",
                    "at": at,
                    "rationale": "written directly with memory_write, before identity changed only by decision",
                }
                for rid, author, at in rows
            ],
        )


def downgrade() -> None:
    op.drop_table("obligation_dispositions")
    op.drop_table("obligations")
    op.drop_table("signal_routings")
    op.drop_table("intelligence_signals")
    op.drop_table("identity_decisions")
    op.drop_table("identity_proposals")
