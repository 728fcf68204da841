"""the hold check and the open listing read a queue of open obligations, kept by triggers, not every obligation

Revision ID: 0020_open_obligations
Revises: 0019_unrouted_signals
"""

import sqlalchemy as sa
from alembic import op

revision = "0020_open_obligations"
down_revision = "0019_unrouted_signals"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)

# Before every SOP run starts (each claimed scheduled run, every 15 s step, each webhook POST, each
# manual run) the runner asks for the oldest open blocking obligation on that SOP. Obligations and
# dispositions are insert-only (seed 001): an obligation is open until a disposition row exists, so
# that question was an anti-join of every obligation the SOP ever had: at 200,000 resolved on one
# SOP, 66 ms of CPU a call on SQLite and 52 ms on PostgreSQL (a hash anti-join over a sequential scan
# of every disposition); 0.3 and 0.6 ms from the queue (bench/sop_hold.py). The open listing
# (dashboard, findings page, ``goclaw obligations``) was the same anti-join over all of them.
# ``open_obligations`` holds the obligations without a disposition, with what the hold check orders
# and filters by, and the database keeps it so: a trigger adds each obligation as it is inserted and
# another removes it as its disposition is inserted, in the same transaction, whatever inserts them
# (an older gateway process during an upgrade, a restore, a hand). ``ix_open_obligations_hold``
# answers the hold check from the index alone. The record tables stay insert-only; the queue is not
# a record, and its rows come and go.
#
# A later migration that batch-alters obligations or obligation_dispositions on SQLite makes these
# triggers again after it: ``batch_alter_table`` copies the table, and its triggers go with the
# old one. The tests that insert rows by SQL and expect the queue to follow would fail.
ADD = "open_obligations_add"
REMOVE = "open_obligations_remove"
COLUMNS = "obligation_id, sop_name, blocks, opened_at"
NEW = "NEW.id, NEW.sop_name, NEW.blocks, NEW.opened_at"


def upgrade() -> None:
    op.create_table(
        "open_obligations",
        sa.Column("obligation_id", sa.String(40), sa.ForeignKey("obligations.id"), primary_key=True),
        sa.Column("sop_name", sa.String(200), nullable=False),
        sa.Column("blocks", sa.Boolean, nullable=False),
        sa.Column("opened_at", TS, nullable=False),
    )
    op.create_index(
        "ix_open_obligations_hold", "open_obligations", ["sop_name", "blocks", "opened_at", "obligation_id"]
    )
    op.execute(
        f"INSERT INTO open_obligations ({COLUMNS}) SELECT o.id, o.sop_name, o.blocks, o.opened_at FROM obligations o"
        " WHERE NOT EXISTS (SELECT 1 FROM obligation_dispositions d WHERE d.obligation_id = o.id)"
    )
    if _sqlite():
        op.execute(
            f"CREATE TRIGGER {ADD} AFTER INSERT ON obligations"
            f" BEGIN INSERT INTO open_obligations ({COLUMNS}) VALUES ({NEW}); END"
        )
        op.execute(
            f"CREATE TRIGGER {REMOVE} AFTER INSERT ON obligation_dispositions"
            " BEGIN DELETE FROM open_obligations WHERE obligation_id = NEW.obligation_id; END"
        )
        return
    op.execute(
        f"CREATE FUNCTION {ADD}() RETURNS trigger LANGUAGE plpgsql AS"
        f" $$ BEGIN INSERT INTO open_obligations ({COLUMNS}) VALUES ({NEW}); RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE FUNCTION {REMOVE}() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN DELETE FROM open_obligations WHERE obligation_id = NEW.obligation_id; RETURN NULL; END $$"
    )
    op.execute(f"CREATE TRIGGER {ADD} AFTER INSERT ON obligations FOR EACH ROW EXECUTE FUNCTION {ADD}()")
    op.execute(
        f"CREATE TRIGGER {REMOVE} AFTER INSERT ON obligation_dispositions FOR EACH ROW EXECUTE FUNCTION {REMOVE}()"
    )


def downgrade() -> None:
    on = {ADD: "obligations", REMOVE: "obligation_dispositions"}
    for name, table in on.items():
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + ("" if _sqlite() else f" ON {table}"))
        if not _sqlite():
            op.execute(f"DROP FUNCTION IF EXISTS {name}()")
    op.drop_table("open_obligations")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"
