"""Shared fixtures: real databases (SQLite file and PostgreSQL), and no internet."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db import make_engine, upgrade

PG_URL = os.environ.get("GOCLAW_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_REQUIRED = os.environ.get("GOCLAW_TEST_PG_REQUIRED") == "1"

# ---- fakes fail loudly: nothing leaves this machine -------------------------------------

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_getaddrinfo = socket.getaddrinfo


def _is_local(host: Any) -> bool:
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _guard_address(sock: socket.socket, address: Any) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
        raise RuntimeError(f"test tried to reach {address!r}: tests may only use 127.0.0.1")


def _connect(self: socket.socket, address: Any) -> None:
    _guard_address(self, address)
    _real_connect(self, address)


def _connect_ex(self: socket.socket, address: Any) -> int:
    _guard_address(self, address)
    return _real_connect_ex(self, address)


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not _is_local(host.decode() if isinstance(host, bytes) else host):
        raise RuntimeError(f"test tried to resolve {host!r}: tests may only use 127.0.0.1")
    return _real_getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _connect  # type: ignore[method-assign]
socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]
socket.getaddrinfo = _getaddrinfo
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")


# ---- PostgreSQL availability ---------------------------------------------------------------

_pg_state: dict[str, str | None] = {}


def _pg_problem() -> str | None:
    """None when PostgreSQL answers, else why not (checked once per run)."""
    if "problem" not in _pg_state:

        async def probe() -> None:
            import asyncpg

            conn = await asyncpg.connect(_asyncpg_dsn(PG_URL), timeout=5)
            await conn.close()

        try:
            asyncio.run(probe())
            _pg_state["problem"] = None
        except Exception as exc:
            _pg_state["problem"] = f"PostgreSQL at {PG_URL} unreachable: {exc}"
    return _pg_state["problem"]


def _asyncpg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


def _require_pg() -> None:
    problem = _pg_problem()
    if problem:
        if PG_REQUIRED:
            pytest.fail(f"{problem} (GOCLAW_TEST_PG_REQUIRED=1)")
        pytest.skip(problem)


async def _fresh_pg_database() -> tuple[str, str]:
    """Create a uniquely named database (so parallel runs never collide); return (url, name)."""
    import asyncpg

    name = "goclaw_t_" + secrets.token_hex(6)
    conn = await asyncpg.connect(_asyncpg_dsn(PG_URL))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, _ = PG_URL.rpartition("/")
    return f"{base}/{name}", name


async def _drop_pg_database(name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_asyncpg_dsn(PG_URL))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL for a fresh, empty database of each backend."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'goclaw.db'}"
        return
    _require_pg()
    url, name = asyncio.run(_fresh_pg_database())
    try:
        yield url
    finally:
        asyncio.run(_drop_pg_database(name))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite database file in a temp folder."""
    return f"sqlite+aiosqlite:///{tmp_path / 'goclaw.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database (skipped, or failed in CI, when absent)."""
    _require_pg()
    url, name = asyncio.run(_fresh_pg_database())
    try:
        yield url
    finally:
        asyncio.run(_drop_pg_database(name))


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    """A migrated engine on each backend."""
    eng = make_engine(db_url)
    await upgrade(eng)
    try:
        yield eng
    finally:
        await eng.dispose()


class Clock:
    """A controllable UTC clock."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> None:
        self.now += timedelta(**kwargs)


@pytest.fixture
def clock() -> Clock:
    """A clock tests move by hand."""
    return Clock()


def alembic_downgrade(conn: Any, revision: str) -> None:
    """Downgrade the database on ``conn`` (a sync connection: ``await conn.run_sync(alembic_downgrade, rev)``)."""
    from alembic import command

    from gateway.db import _alembic_config

    cfg = _alembic_config()
    cfg.attributes["connection"] = conn
    command.downgrade(cfg, revision)


async def query_plan(engine: AsyncEngine, statement: Any) -> str:
    """The database's plan for a statement (its values bound): SQLite's query plan as text, one line
    a step; PostgreSQL's plan of a run (``EXPLAIN (ANALYZE, FORMAT JSON)``), as JSON text."""
    sql = str(statement.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            return "\n".join(str(r[-1]) for r in await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
        (plan,) = (await conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)).one()
    return json.dumps(plan if not isinstance(plan, str) else json.loads(plan))


@contextlib.contextmanager
def captured_reads(engine: AsyncEngine, table: str) -> Iterator[list[tuple[str, Any]]]:
    """The SELECT statements naming ``table`` that ``engine`` runs inside the block, with their parameters
    (for ``explain_captured``): what a store method really sends, not a statement rebuilt by the test."""
    reads: list[tuple[str, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, params: Any, _context: Any, _many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and table in statement:
            reads.append((statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", seen)
    try:
        yield reads
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", seen)


async def explain_captured(engine: AsyncEngine, statement: str, params: Any, *, analyze: bool = False) -> str:
    """The plan of a captured statement (``captured_reads``): SQLite's query plan as text, one line a step;
    PostgreSQL's as JSON text, estimated, or with ``analyze`` of a run (the statement runs: reads only)."""
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            return "\n".join(str(r[-1]) for r in await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params))
        how = "(ANALYZE, FORMAT JSON)" if analyze else "(FORMAT JSON)"
        (plan,) = (await conn.exec_driver_sql(f"EXPLAIN {how} " + statement, params)).one()
    return json.dumps(plan if not isinstance(plan, str) else json.loads(plan))


def pg_scans(plan: str, relation: str | None = None) -> list[dict[str, Any]]:
    """The scan nodes of a PostgreSQL JSON plan (``query_plan``), of ``relation``'s table or index if given."""

    def nodes(node: Any) -> list[dict[str, Any]]:
        if isinstance(node, list):
            return [n for child in node for n in nodes(child)]
        if not isinstance(node, dict):
            return []
        here = [node] if "Node Type" in node else []
        return here + [n for key in ("Plan", "Plans") if key in node for n in nodes(node[key])]

    scans = [n for n in nodes(json.loads(plan)) if n["Node Type"].endswith("Scan")]
    if relation is None:
        return scans
    # A bitmap index scan names only its index (``ix_<table>_...``); the others name their table.
    return [
        n
        for n in scans
        if n.get("Relation Name") == relation or str(n.get("Index Name", "")).startswith(f"ix_{relation}_")
    ]


def pg_rows_visited(scans: list[dict[str, Any]]) -> int:
    """The rows a PostgreSQL run's scans produced or filtered out, over all their loops."""
    return sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) + n.get("Rows Removed by Filter", 0) for n in scans)
