"""The database: one async engine, Alembic migrations, and clear errors."""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"


def _sqlite_path(url: str) -> Path | None:
    u = make_url(url)
    if not u.drivername.startswith("sqlite") or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def prepare_sqlite_dir(url: str) -> None:
    """Create the SQLite file's folder, with an error that names it if that is impossible."""
    path = _sqlite_path(url)
    if path is None:
        return
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(
            f"cannot create the database folder {folder}: {exc.strerror}; make it writable or set database.url"
        ) from None
    if not os.access(folder, os.W_OK):
        raise DatabaseUnavailable(
            f"the database folder {folder} is not writable; fix its permissions or set database.url"
        )
    if path.exists() and not os.access(path, os.W_OK):
        raise DatabaseUnavailable(f"the database file {path} is not writable; fix its permissions")


WAL_LIMIT_BYTES = 16 * 1024 * 1024
"""``database.wal_limit_mb``'s default: the size SQLite's write-ahead log is cut back to when it starts again."""


def make_engine(
    url: str, *, echo: bool = False, async_creator: Any = None, wal_limit_bytes: int = WAL_LIMIT_BYTES
) -> AsyncEngine:
    """An async engine; SQLite gets WAL, foreign keys, a busy timeout and the WAL's size limit.

    ``async_creator`` makes the driver's connections (``gateway.sqlite_inline``'s, for the background thread).
    ``wal_limit_bytes`` is each connection's ``journal_size_limit``: the first commit after the WAL
    starts again cuts the file to it (the job process's checkpoints start it again past that size).
    """
    prepare_sqlite_dir(url)
    kwargs: dict[str, Any] = {"echo": echo}
    if async_creator is not None:
        kwargs["async_creator"] = async_creator
    if url.startswith("sqlite"):
        # SQLite has one writer at a time; several pooled connections only make
        # them wait on each other in SQLite's busy handler (sleeps of up to 100 ms).
        # One connection, queued in asyncio, is faster and fair. PostgreSQL is the
        # path for concurrency across processes.
        kwargs["connect_args"] = {"timeout": 30}
        kwargs["pool_size"] = 1
        kwargs["max_overflow"] = 0
        kwargs["pool_timeout"] = 60
    engine = create_async_engine(url, **kwargs)
    if not url.startswith("sqlite"):
        _ping_when_idle(engine)
        return engine

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA journal_size_limit={int(wal_limit_bytes)}")
        if _checkpoints_elsewhere:
            cur.execute("PRAGMA wal_autocheckpoint=0")  # another process copies the WAL (checkpoint_elsewhere)
        cur.close()

    return engine


PING_AFTER_IDLE_S = 2.0
"""A pooled PostgreSQL connection idle in the pool longer than this is pinged when checked out."""


def _ping_when_idle(engine: AsyncEngine) -> None:
    """Ping a pooled connection at checkout only when it has been idle ``PING_AFTER_IDLE_S`` or longer.

    ``pool_pre_ping`` pinged at every checkout, and the asyncpg dialect's ping is three
    round trips (a transaction begun, an empty statement, a rollback). A session of the
    cold paths (the dashboard, the CLI, an extraction's memory writes in the job process)
    checks out once or more: under ``bench/turn_overhead.py`` on PostgreSQL the job
    process checked out about once in eight turns, 0.36 round trips a turn beside the
    turn's own three (``bench/engine_checkout.py`` times one session). A connection back
    in the pool less than two seconds ago is alive unless the server went away within
    them; then its statement fails as a storage fault (a 503 that says so, or a job tried
    again), SQLAlchemy invalidates the pool's connections, and the next checkout connects
    afresh, as the hot store's own pool does (``gateway/hotstore/pgpool.py``). A
    connection idle longer (a quiet dashboard, a restart meanwhile, an idle timeout) is
    pinged as before, and replaced if the ping fails.
    """

    @event.listens_for(engine.sync_engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return  # just connected, or back in the pool a moment ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # The pool closes this connection and checks out another (PoolEvents.checkout).
            raise DisconnectionError(
                f"a pooled connection idle {time.monotonic() - since:.0f} s failed its ping"
            ) from exc


_checkpoints_elsewhere = False


def checkpoint_elsewhere() -> None:
    """From now on this process's SQLite connections never checkpoint the WAL on commit.

    By default the connection whose commit takes the WAL past 1,000 pages copies
    them into the database file then and there: on the turns' loop, 5-10 ms, up to
    40 ms with the disk busy, about 7 times a second under a real model's load, and
    ``/healthz`` waited behind each one. ``goclaw serve`` calls this when it starts
    its job process, which checkpoints every second instead (``gateway/jobproc.py``);
    the job process calls it too, for its own connections: SQLite starts the WAL again
    only past ``database.wal_limit_mb``, so between 1,000 pages and that limit every
    commit of a job (its memory write, its finish) copied the WAL again, a hot page
    once more each time, besides the copy each second. It covers every connection
    ``make_engine`` sets up after the call: the engine's, and the hot store's, which runs
    the engine's connect hooks. Without a process that checkpoints, SQLite's default stays.
    """
    global _checkpoints_elsewhere
    _checkpoints_elsewhere = True


def dialect_insert(dialect: str, table: Any) -> Any:
    """An ``INSERT`` of ``dialect`` (``postgresql`` or ``sqlite``), with its ``ON CONFLICT`` clauses.

    The dialect's module is imported here, at first use: a gateway on SQLite
    never loads SQLAlchemy's PostgreSQL dialect (a few tens of milliseconds at start).
    """
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table)


def describe_db_error(url: str, exc: BaseException) -> str:
    """One line for a person: what failed and what to do."""
    safe = make_url(url).render_as_string(hide_password=True)
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc) else type(exc).__name__
    if "file is not a database" in detail or "malformed" in detail:
        return f"the database at {safe} is corrupt ({detail}); restore it from a backup or point database.url elsewhere"
    return f"cannot use the database at {safe}: {detail}; check database.url and that the server is running"


def _alembic_config() -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def _upgrade(conn: Connection, revision: str) -> None:
    from alembic import command

    cfg = _alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, revision)


_REVISION_LINE = re.compile(r'^(down_revision|revision)\s*=\s*["\']([^"\']+)["\']', re.MULTILINE)


@functools.cache
def head_revision() -> str:
    """The newest migration's id, read from the revision files without importing Alembic.

    Alembic's import costs about a tenth of a second; a gateway restarting on an
    up-to-date database should not pay it (``tests/gateway/test_db_head.py`` checks
    this agrees with Alembic's own answer).
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        for key, value in _REVISION_LINE.findall(path.read_text(encoding="utf-8")):
            (revisions if key == "revision" else parents).add(value)
    heads = revisions - parents
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads ({', '.join(sorted(heads))}); chain them into one")
    return heads.pop()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Apply Alembic migrations up to ``revision``; a database already at head costs one query.

    Raises:
        DatabaseUnavailable: the database cannot be reached or is corrupt.
    """
    url = engine.url.render_as_string(hide_password=False)
    try:
        if revision == "head" and await current_revision(engine) == head_revision():
            return
        async with engine.begin() as conn:
            await conn.run_sync(_upgrade, revision)
    except (OperationalError, DBAPIError, OSError, SQLAlchemyError) as exc:
        raise DatabaseUnavailable(describe_db_error(url, exc)) from None


async def check(engine: AsyncEngine) -> None:
    """Raise DatabaseUnavailable unless the database answers."""
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except (OperationalError, DBAPIError, OSError, SQLAlchemyError) as exc:
        raise DatabaseUnavailable(describe_db_error(engine.url.render_as_string(hide_password=False), exc)) from None


async def current_revision(engine: AsyncEngine) -> str | None:
    """The applied Alembic revision, or None on an empty database."""
    try:
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT version_num FROM alembic_version"))).first()
            return row[0] if row else None
    except (OperationalError, DBAPIError):
        return None
