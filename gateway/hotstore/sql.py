"""The hot path's statements, written once with ``?`` parameters (``numbered`` gives PostgreSQL's ``$n``).

Booleans are the SQL literals TRUE/FALSE (SQLite stores them as 1/0, as
SQLAlchemy does); every table and column is the one Alembic created.
"""

from __future__ import annotations

import re

MESSAGE_SELECT = (
    "SELECT id, session_id, platform_message_id, speaker_user_id, stored_role, display_name, text, said_at, is_agent,"
    " reply_to_id, answering_until FROM messages"
)
USER_ROLE = "SELECT role, display_name FROM users WHERE id = ?"
IDENTITY_ROLE = (
    "SELECT users.id, users.role, users.display_name FROM users JOIN identities ON identities.user_id = users.id"
    " WHERE identities.channel = ? AND identities.platform_user_id = ?"
)
FIND_SESSION = "SELECT id, previous_context FROM sessions WHERE channel = ? AND conversation_id = ? AND thread_id = ?"
NEW_SESSION = (
    "INSERT INTO sessions (id, channel, conversation_id, thread_id, parent_conversation_id,"
    " previous_context, extracted_through, created_at, updated_at) VALUES (?, ?, ?, ?, ?, '', 0, ?, ?)"
    " ON CONFLICT (channel, conversation_id, thread_id) DO NOTHING"
)
NEW_MESSAGE = (
    "INSERT INTO messages (session_id, platform_message_id, speaker_user_id, stored_role, display_name,"
    " text, said_at, is_agent, created_at, reply_requested, answering_until)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, FALSE, ?, ?, ?)"
    " ON CONFLICT (session_id, is_agent, platform_message_id) DO NOTHING RETURNING id"
)
OLD_MESSAGE = (
    "SELECT id, reply_requested FROM messages WHERE session_id = ? AND is_agent = FALSE AND platform_message_id = ?"
)
ASK_REPLY = "UPDATE messages SET reply_requested = TRUE WHERE id = ?"
REPLY = "SELECT text FROM messages WHERE reply_to_id = ?"
_HISTORY_WHERE = " WHERE session_id = ? AND archive_id IS NULL AND id <= ? ORDER BY id DESC LIMIT ?"
HISTORY = MESSAGE_SELECT + _HISTORY_WHERE
MESSAGE_BY_ID = MESSAGE_SELECT + " WHERE id = ?"
STORE = (
    "INSERT INTO messages (session_id, platform_message_id, speaker_user_id, stored_role, display_name,"
    " text, said_at, is_agent, created_at, reply_to_id, reply_requested) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, FALSE)"
    " ON CONFLICT DO NOTHING RETURNING id"
)
TURN_RECORD = (
    "INSERT INTO turn_records (session_id, message_id, reply_message_id, at, speaker_user_id, stored_role,"
    " memory, sections, model_calls) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id"
)
TRIM_SESSION = (
    "SELECT id, channel, conversation_id, thread_id, previous_context, extracted_through FROM sessions WHERE id = ?"
)
_LIVE_WHERE = " WHERE session_id = ? AND archive_id IS NULL ORDER BY id"
LIVE = MESSAGE_SELECT + _LIVE_WHERE

# SQLite's kept rows (gateway/hotstore/sqlite.py, ``_kept_rows``): each row's id and version first, then only
# the rows not kept, read whole with their version last. The version is created_at and answering_until in one
# string (``sqlite.row_version`` makes the same from the values bound): a string, unlike a tuple, is never
# tracked by the cyclic collector, and the kept rows keep one each (gateway/heap.py).
ROW_VERSION = "created_at || '/' || coalesce(answering_until, '')"
_MESSAGE_KEY = f"SELECT id, {ROW_VERSION} FROM messages"
_KEYED_SELECT = MESSAGE_SELECT.replace(" FROM messages", f", {ROW_VERSION} FROM messages")
HISTORY_KEYS, KEYED_HISTORY = _MESSAGE_KEY + _HISTORY_WHERE, _KEYED_SELECT + _HISTORY_WHERE
LIVE_KEYS, KEYED_LIVE = _MESSAGE_KEY + _LIVE_WHERE, _KEYED_SELECT + _LIVE_WHERE
KEYED_MESSAGE_BY_ID = _KEYED_SELECT + " WHERE id = ?"
ARCHIVE = (
    "INSERT INTO archives (id, session_id, created_at, start_at, end_at, trust, message_count, summary, markdown)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
TRIMMED_SESSION = "UPDATE sessions SET previous_context = ?, extracted_through = ? WHERE id = ?"
EXTRACT_JOB = (
    "INSERT INTO jobs (kind, payload, status, attempts, run_after, created_at)"
    " VALUES ('extract', ?, 'pending', 0, ?, ?) RETURNING id"
)
# A job queued by a turn (a trim, run by the job process or ``goclaw worker``), due now.
QUEUE_JOB = (
    "INSERT INTO jobs (kind, payload, status, attempts, run_after, created_at)"
    " VALUES (?, ?, 'pending', 0, ?, ?) RETURNING id"
)
# Job ? still pending, of kind ? and for session ?. Kind and session are checked too: on SQLite a deleted
# job's id may be given again.
PENDING_JOB = (
    "SELECT 1 FROM jobs WHERE id = ? AND status = 'pending' AND kind = ? AND json_extract(payload, '$.session_id') = ?"
)
# ``QUEUE_JOB``, unless that job is still pending: then no row (it will do what this one would).
QUEUE_JOB_UNLESS_PENDING = (
    "INSERT INTO jobs (kind, payload, status, attempts, run_after, created_at)"
    " SELECT ?, ?, 'pending', 0, ?, ? WHERE NOT EXISTS (" + PENDING_JOB + ") RETURNING id"
)

# ---- the job queue (the worker's every job: claim, the trimmed slice, done) -------------
JOB_COLUMNS = (
    "id, kind, payload, status, attempts, run_after, locked_by, locked_at, last_error, raw_answer, created_at,"
    " finished_at"
)


def next_job(n_kinds: int) -> str:
    """The oldest runnable job of ``n_kinds`` kinds: due and pending, or running on an expired lease.

    Parameters: the kinds and now (due), then the kinds again and the lease cut-off.

    Two parts, each walking ``ix_jobs_claim`` (status, id) in id order to its first match, and
    the older of the two: with one ``OR`` the database read every due pending job and sorted
    them to take one (a queue of N jobs cost O(N) a claim).
    """
    kinds = ", ".join("?" * n_kinds)
    part = "SELECT id, status, attempts FROM (SELECT id, status, attempts FROM jobs WHERE status = '{}'"
    return (
        part.format("pending") + f" AND kind IN ({kinds}) AND run_after <= ? ORDER BY id LIMIT 1)"
        " UNION ALL "
        + part.format("running")
        + f" AND kind IN ({kinds}) AND locked_at < ? ORDER BY id LIMIT 1) ORDER BY id LIMIT 1"
    )


CLAIM_JOB = (
    "UPDATE jobs SET status = 'running', locked_by = ?, locked_at = ?, attempts = attempts + 1"
    " WHERE id = ? AND status = ? AND attempts = ? RETURNING " + JOB_COLUMNS
)
FINISH_JOB = "UPDATE jobs SET status = 'done', finished_at = ?, last_error = NULL WHERE id = ?"
# A done job whose outcome is recorded elsewhere (a trim's archive, a revision's rows) is deleted instead.
FORGET_JOB = "DELETE FROM jobs WHERE id = ?"
# By the archive's session first: messages are indexed by (session_id, archive_id, id); by
# archive_id alone it was a scan of every stored message (1 ms at 13,000, growing with them).
ARCHIVE_MESSAGES = (
    MESSAGE_SELECT + " WHERE session_id = (SELECT session_id FROM archives WHERE id = ?) AND archive_id = ? ORDER BY id"
)


def numbered(sql: str) -> str:
    """``?`` parameters as ``$1``, ``$2``, ... (no statement here has a ``?`` inside a literal)."""
    counter = iter(range(1, sql.count("?") + 1))
    return re.sub(r"\?", lambda _m: f"${next(counter)}", sql)
