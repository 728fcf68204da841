"""a stored message is append-only: what was said, by whom and when is never changed after its insert

Revision ID: 0015_messages_append_only
Revises: 0014_operator_logouts
"""

from alembic import op

revision = "0015_messages_append_only"
down_revision = "0014_operator_logouts"
branch_labels = None
depends_on = None

# What may change after the insert: archive_id (a trim), reply_requested (a message asked
# again for its answer) and answering_until (the ordering lease). Everything else is the
# record of what was said: a note's provenance points at it, and the SQLite hot store keeps
# rows it read by (id, created_at, answering_until), reading the text again only for rows
# it has not kept (gateway/hotstore/sqlite.py, ``_kept_rows``). A later migration that must
# change these columns drops the trigger first and makes it again after (SQLite's
# ``batch_alter_table`` on messages copies the table, and the trigger goes with the old one).
FIXED = (
    "id",
    "session_id",
    "platform_message_id",
    "speaker_user_id",
    "stored_role",
    "display_name",
    "text",
    "said_at",
    "is_agent",
    "created_at",
    "reply_to_id",
)
MESSAGE = (
    "a stored message is not changed after its insert (only archive_id, reply_requested and answering_until are);"
    " store a new message instead"
)
_CHANGED = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in FIXED)


def upgrade() -> None:
    if _sqlite():
        changed = _CHANGED.replace("IS DISTINCT FROM", "IS NOT")
        op.execute(
            f"CREATE TRIGGER messages_append_only BEFORE UPDATE OF {', '.join(FIXED)} ON messages"
            f" WHEN {changed} BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        )
    else:
        op.execute(
            "CREATE FUNCTION messages_append_only() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'check_violation'; END $$"
        )
        op.execute(
            f"CREATE TRIGGER messages_append_only BEFORE UPDATE OF {', '.join(FIXED)} ON messages"
            f" FOR EACH ROW WHEN ({_CHANGED}) EXECUTE FUNCTION messages_append_only()"
        )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS messages_append_only" + ("" if _sqlite() else " ON messages"))
    if not _sqlite():
        op.execute("DROP FUNCTION IF EXISTS messages_append_only()")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"
