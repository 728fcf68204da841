"""the router reads a queue of unrouted signals, kept by triggers, not every signal ever reported

Revision ID: 0019_unrouted_signals
Revises: 0018_subject_index_owner
"""

import sqlalchemy as sa
from alembic import op

revision = "0019_unrouted_signals"
down_revision = "0018_subject_index_owner"
branch_labels = None
depends_on = None

# Before each SOP scheduler step (every 15 s) and before each SOP run, the serving process's worker
# thread routes every signal without a routing row. Signals and routings are insert-only (seed 001),
# so that look was an anti-join of every signal ever reported: 54 ms of CPU a call at 200,000
# signals on SQLite, and as long on PostgreSQL, with nothing to route (bench/signal_routing.py).
# ``unrouted_signals`` holds the ids of the signals without a routing, and the database keeps it so:
# a trigger adds each signal as it is inserted and another removes it as its routing is inserted,
# in the same transaction, whatever inserts them (an older gateway process during an upgrade, a
# restore, a hand). The router reads the queue and costs what is waiting. The record tables stay
# insert-only; the queue is not a record, and its rows come and go.
#
# A later migration that batch-alters intelligence_signals or signal_routings on SQLite makes these
# triggers again after it: ``batch_alter_table`` copies the table, and its triggers go with the
# old one. The tests that insert rows by SQL and expect the queue to follow would fail.
ADD = "unrouted_signals_add"
REMOVE = "unrouted_signals_remove"


def upgrade() -> None:
    op.create_table(
        "unrouted_signals",
        sa.Column("signal_id", sa.String(40), sa.ForeignKey("intelligence_signals.id"), primary_key=True),
    )
    op.execute(
        "INSERT INTO unrouted_signals (signal_id) SELECT s.id FROM intelligence_signals s"
        " WHERE NOT EXISTS (SELECT 1 FROM signal_routings r WHERE r.signal_id = s.id)"
    )
    if _sqlite():
        op.execute(
            f"CREATE TRIGGER {ADD} AFTER INSERT ON intelligence_signals"
            " BEGIN INSERT INTO unrouted_signals (signal_id) VALUES (NEW.id); END"
        )
        op.execute(
            f"CREATE TRIGGER {REMOVE} AFTER INSERT ON signal_routings"
            " BEGIN DELETE FROM unrouted_signals WHERE signal_id = NEW.signal_id; END"
        )
        return
    op.execute(
        f"CREATE FUNCTION {ADD}() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO unrouted_signals (signal_id) VALUES (NEW.id); RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE FUNCTION {REMOVE}() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN DELETE FROM unrouted_signals WHERE signal_id = NEW.signal_id; RETURN NULL; END $$"
    )
    op.execute(f"CREATE TRIGGER {ADD} AFTER INSERT ON intelligence_signals FOR EACH ROW EXECUTE FUNCTION {ADD}()")
    op.execute(f"CREATE TRIGGER {REMOVE} AFTER INSERT ON signal_routings FOR EACH ROW EXECUTE FUNCTION {REMOVE}()")


def downgrade() -> None:
    on = {ADD: "intelligence_signals", REMOVE: "signal_routings"}
    for name, table in on.items():
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + ("" if _sqlite() else f" ON {table}"))
        if not _sqlite():
            op.execute(f"DROP FUNCTION IF EXISTS {name}()")
    op.drop_table("unrouted_signals")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"
